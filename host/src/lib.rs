//! wasmstate: a Terraform/OpenTofu `backend "http"` server whose storage
//! drivers are sandboxed WebAssembly components.
//!
//! Layers, each in its own module:
//! - [`protocol`]: Terraform's HTTP protocol and the workspace API, over the
//!   [`backend::Storage`] trait; knows nothing of wasmtime.
//! - [`runtime`]: wasmtime engine, compiled-guest cache, one fresh limited
//!   instance per request; implements [`backend::Storage`]; never parses HTTP.
//! - [`tfe`]: the TFE API v2 subset behind Terraform's `cloud {}` block
//!   and `backend "remote"`, over the protocol's [`protocol::App`].
//! - [`console`]: the operator console (`/ui`), pages over the protocol's
//!   [`protocol::App`].
//! - [`config`]: the TOML config file, validated once at startup.
//! - [`guests`]: the first-party guests embedded in the binary.
//! - [`marketplace`]: installed guests: manifests, grants, signatures, store.
//! - [`auth`]: users, tokens and what each may do.
//! - [`policy`]: which origins a guest may call over HTTP.
//! - [`capabilities`]: what the host lends guests beyond WASI (git).
//! - [`metrics`]: what `GET /metrics` reports, fed by both layers.
//! - [`store`]: encryption at rest and version history, around any storage.
//! - [`tls`]: HTTPS and client certificates for `serve`.
//! - [`listen`]: accepting connections, their deadlines and caps, and
//!   graceful shutdown.
//! - [`reload`]: swapping backends in on SIGHUP while requests run.
//! - [`server`], [`cli`], [`client`]: the `wasmstate` command.
#![warn(missing_docs)]

pub mod audit;
pub mod auth;
pub mod backend;
pub mod capabilities;
pub mod cli;
pub mod client;
pub mod config;
pub mod conformance;
pub mod console;
pub mod contract;
pub mod digest;
pub mod guests;
pub mod listen;
pub mod loader;
pub mod logline;
pub mod marketplace;
pub mod metrics;
pub mod names;
pub mod policy;
pub mod protocol;
pub mod reload;
pub mod request;
pub mod resealing;
pub mod runtime;
pub mod server;
pub mod statefile;
pub mod store;
pub mod tfe;
pub mod tls;
pub mod work;
