//! wasmstate's integration tests: one binary, one module per concern. Each
//! test starts real `wasmstate` processes on free loopback ports and talks
//! to them over HTTP; end-to-end tests drive the real `terraform` binary.

mod audit;
mod auth;
mod aws;
mod aws_credentials;
mod azure;
mod big_states;
mod chaos;
mod common;
mod concurrency;
mod conformance;
mod console;
mod docs;
mod escapes;
mod etcd;
mod gcp_credentials;
mod gcs;
mod git;
mod hostile;
mod isolation;
mod kms;
mod languages;
mod locks;
mod marketplace;
mod metrics;
mod network;
mod oidc;
mod opentofu;
mod postgres;
mod production;
mod protocol;
mod quota_races;
mod ready_instances;
mod safety;
mod sandbox;
mod shared_history;
mod side_by_side;
mod storage_faults;
mod terraform;
mod trust;
