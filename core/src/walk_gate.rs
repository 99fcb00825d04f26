//! A gate for an invariant check that walks a structure: the walk runs again only after the
//! structure changed. The structure's writers count their changes ([`WalkGate::changed`]); the
//! check passes its walk to [`WalkGate::walk`], which runs it when the count moved since the
//! last walk that passed. The simulator checks the touched node after every event, and a walk of
//! a large structure that did not change since it last passed proves nothing new.
//!
//! Sound only when every change goes through a writer that counts it: a gated structure's fields
//! are private to its module and its doc names those writers.

use std::cell::Cell;

/// Changes counted, and the count the last passing walk saw; see the module doc. A clone is a
/// gate of a clone of the structure, in the same state.
#[derive(Clone, Debug, Default)]
pub(crate) struct WalkGate {
    changes: u64,
    walked: Cell<Option<u64>>,
}

impl WalkGate {
    /// Counts one change to the gated structure.
    pub(crate) fn changed(&mut self) {
        self.changes += 1;
    }

    /// Runs `walk` (which asserts) unless it passed since the last change.
    pub(crate) fn walk(&self, walk: impl FnOnce()) {
        if self.walked.get() != Some(self.changes) {
            walk();
            self.walked.set(Some(self.changes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_runs_first_and_then_only_after_a_change() {
        let mut gate = WalkGate::default();
        let runs = Cell::new(0);
        let walk = || runs.set(runs.get() + 1);
        gate.walk(walk);
        gate.walk(walk);
        assert_eq!(runs.get(), 1, "no change: no second walk");
        gate.changed();
        gate.walk(walk);
        gate.walk(walk);
        assert_eq!(runs.get(), 2, "one walk after the change");
    }
}
