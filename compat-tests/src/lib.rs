//! Compat tests live in tests/ and python/.
