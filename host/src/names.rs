//! The name rule, shared with the guest SDK through `wasmstate-types`.

pub use wasmstate_types::names::{MAX_NAME_LEN, check_name};
