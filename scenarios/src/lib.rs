//! Seeded cluster-failure scenarios for dart, built on `dart-sim`.
