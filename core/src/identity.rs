//! Object identity from a URL (spec/geometry.md §2) and the chunk-key namespace.
//!
//! CONTRACT (to be implemented):
//! - `pub enum IdLayout { Distribution, OciOnly }` (Default = Distribution)
//! - `pub struct ObjectId { pub id: String, pub content_addressed: bool }`
//! - `pub fn is_digest(s: &str) -> bool`
//! - `pub fn object_id(url: &str, layout: IdLayout) -> ObjectId`
//! - `pub struct Namespace(String)`, `Namespace::new(&str) -> Result<Namespace, NamespaceError>`
//!   refusing empty and 0x1F-containing names, `as_str()`, `Default` = "dart".
