//! Shared helpers live in the tests; this crate has no library code.
