//! tokio/hyper shell for dart: it moves bytes for the decisions `dart-core` makes.

pub mod store;
