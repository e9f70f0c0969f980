//! The slice of etcd's v3 JSON gateway this guest uses: range, put,
//! delete-range and transactions, with keys and values base64-encoded.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::{Value, json};
use wasmstate_guest::{Error, http};

/// One key-value pair as etcd returns it.
#[derive(Debug, Clone, Deserialize)]
pub struct Kv {
    #[serde(default, deserialize_with = "b64")]
    pub key: Vec<u8>,
    #[serde(default, deserialize_with = "b64")]
    pub value: Vec<u8>,
    #[serde(default, deserialize_with = "int")]
    pub mod_revision: i64,
}

fn b64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    B64.decode(text).map_err(serde::de::Error::custom)
}

/// The gateway writes 64-bit integers as strings.
fn int<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(serde::de::Error::custom),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| serde::de::Error::custom("not an i64")),
        _ => Err(serde::de::Error::custom("not an integer")),
    }
}

#[derive(Deserialize, Default)]
struct RangeResponse {
    #[serde(default)]
    kvs: Vec<Kv>,
}

#[derive(Deserialize, Default)]
struct PrevKvs {
    #[serde(default)]
    prev_kv: Option<Kv>,
    #[serde(default)]
    prev_kvs: Vec<Kv>,
}

#[derive(Deserialize)]
struct TxnResponse {
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<Value>,
}

/// A condition of a transaction.
#[derive(Clone, Copy)]
pub enum Compare<'a> {
    /// The key does not exist.
    Absent(&'a str),
    /// The key exists.
    Present(&'a str),
    /// The key was last modified at this revision.
    ModRevision(&'a str, i64),
}

/// One operation inside a transaction.
pub enum Op<'a> {
    /// Put a value, returning the previous one.
    Put(&'a str, &'a [u8]),
    /// Delete a key, returning the previous value.
    Delete(&'a str),
    /// Read a key.
    Get(&'a str),
}

/// Outcome of a transaction: whether the comparison held, and the previous
/// or read values of each operation that ran, in order.
pub struct TxnOutcome {
    pub succeeded: bool,
    pub kvs: Vec<Option<Kv>>,
}

/// A client for one etcd endpoint.
pub struct Etcd {
    endpoint: String,
}

fn key(k: &str) -> String {
    B64.encode(k)
}

/// The key just past every key starting with `prefix`.
fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    if let Some(last) = bytes.last_mut() {
        *last += 1;
    }
    B64.encode(bytes)
}

impl Etcd {
    pub fn new(endpoint: &str) -> Self {
        Etcd {
            endpoint: endpoint.trim_end_matches('/').to_string(),
        }
    }

    fn call(&self, path: &str, body: Value) -> Result<Value, Error> {
        let url = format!("{}/v3/kv/{path}", self.endpoint);
        let answer = http::post_json(&url, &body)?;
        if answer.is_success() {
            return answer.json();
        }
        let message = String::from_utf8_lossy(&answer.body).into_owned();
        Err(if answer.status >= 500 || answer.status == 429 {
            Error::Unavailable(format!("etcd {path}: {} {message}", answer.status))
        } else if message.contains("too large") {
            Error::Internal(format!(
                "etcd refused a request as too large; lower `chunk_kib` ({message})"
            ))
        } else {
            Error::Internal(format!("etcd {path}: {} {message}", answer.status))
        })
    }

    fn parse<T: serde::de::DeserializeOwned + Default>(value: Value) -> Result<T, Error> {
        serde_json::from_value(value)
            .map_err(|e| Error::Internal(format!("unexpected answer from etcd: {e}")))
    }

    /// The value of `k`, if set.
    pub fn get(&self, k: &str) -> Result<Option<Kv>, Error> {
        let r: RangeResponse = Self::parse(self.call("range", json!({"key": key(k)}))?)?;
        Ok(r.kvs.into_iter().next())
    }

    /// Every pair whose key starts with `prefix`, in key order.
    pub fn list(&self, prefix: &str, keys_only: bool) -> Result<Vec<Kv>, Error> {
        let body =
            json!({"key": key(prefix), "range_end": prefix_end(prefix), "keys_only": keys_only});
        let r: RangeResponse = Self::parse(self.call("range", body)?)?;
        Ok(r.kvs)
    }

    /// Set `k`.
    pub fn put(&self, k: &str, value: &[u8]) -> Result<(), Error> {
        self.call("put", json!({"key": key(k), "value": B64.encode(value)}))?;
        Ok(())
    }

    /// Delete `k`, returning what it held.
    pub fn delete(&self, k: &str) -> Result<Option<Kv>, Error> {
        let r: PrevKvs =
            Self::parse(self.call("deleterange", json!({"key": key(k), "prev_kv": true}))?)?;
        Ok(r.prev_kvs.into_iter().next())
    }

    /// Delete every key starting with `prefix`.
    pub fn delete_prefix(&self, prefix: &str) -> Result<(), Error> {
        self.call(
            "deleterange",
            json!({"key": key(prefix), "range_end": prefix_end(prefix)}),
        )?;
        Ok(())
    }

    /// If every comparison holds run `success`, else run `failure`.
    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnOutcome, Error> {
        let compare: Vec<Value> = compare
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => json!({"key": key(k), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}),
                Compare::Present(k) => json!({"key": key(k), "result": "GREATER", "target": "CREATE", "create_revision": "0"}),
                Compare::ModRevision(k, rev) => json!({"key": key(k), "result": "EQUAL", "target": "MOD", "mod_revision": rev.to_string()}),
            })
            .collect();
        let ops = |ops: &[Op]| -> Vec<Value> {
            ops.iter()
                .map(|op| match op {
                    Op::Put(k, v) => json!({"request_put": {"key": key(k), "value": B64.encode(v), "prev_kv": true}}),
                    Op::Delete(k) => json!({"request_delete_range": {"key": key(k), "prev_kv": true}}),
                    Op::Get(k) => json!({"request_range": {"key": key(k)}}),
                })
                .collect()
        };
        let body = json!({"compare": compare, "success": ops(success), "failure": ops(failure)});
        let r: TxnResponse = serde_json::from_value(self.call("txn", body)?)
            .map_err(|e| Error::Internal(format!("unexpected answer from etcd: {e}")))?;
        let kvs = r
            .responses
            .into_iter()
            .map(|resp| {
                if let Some(put) = resp.get("response_put") {
                    Self::parse::<PrevKvs>(put.clone()).map(|p| p.prev_kv)
                } else if let Some(del) = resp.get("response_delete_range") {
                    Self::parse::<PrevKvs>(del.clone()).map(|p| p.prev_kvs.into_iter().next())
                } else if let Some(range) = resp.get("response_range") {
                    Self::parse::<RangeResponse>(range.clone()).map(|r| r.kvs.into_iter().next())
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(TxnOutcome {
            succeeded: r.succeeded,
            kvs,
        })
    }
}
