//! Capabilities the host lends guests beyond WASI, each granted per backend
//! by the operator. Plain Rust: the runtime adapts them to WIT.

pub mod aws;
pub mod azure;
pub mod gcp;
pub mod git;
