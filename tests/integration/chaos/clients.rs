//! Terraform-like clients: each picks a workspace and a host at random for
//! every step (replicas behind a load balancer), and records every step.

use super::history::{Op, Outcome, Recorder, Seen, Written};
pub use crate::common::Rng;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The hosts being served right now: `None` while one is down.
#[derive(Default)]
pub struct Hosts(RwLock<Vec<Option<String>>>);

impl Hosts {
    /// `count` hosts, none up yet.
    pub fn new(count: usize) -> Hosts {
        Hosts(RwLock::new(vec![None; count]))
    }

    /// Host `i` is at `url` (`None`: down).
    pub fn set(&self, i: usize, url: Option<String>) {
        self.0.write().unwrap()[i] = url;
    }

    /// Every host that is up now: (index, base URL).
    pub fn up(&self) -> Vec<(usize, String)> {
        let hosts = self.0.read().unwrap().clone();
        hosts
            .into_iter()
            .enumerate()
            .filter_map(|(i, url)| Some((i, url?)))
            .collect()
    }

    /// A host that is up, at random: (index, base URL).
    pub fn pick(&self, rng: &mut Rng) -> (usize, String) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let up = self.up();
            if !up.is_empty() {
                return up[rng.below(up.len())].clone();
            }
            assert!(Instant::now() < deadline, "no host came back within 120 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// sha256 of `bytes`, shortened for the report.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..8])
}

/// What the checker needs of a state body.
fn seen(body: &[u8]) -> Seen {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let nothing_in = |field: &str| match &value[field] {
        serde_json::Value::Null => true,
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(items) => items.is_empty(),
        _ => false,
    };
    Seen {
        lineage: value["lineage"].as_str().unwrap_or_default().to_string(),
        serial: value["serial"].as_u64().unwrap_or_default(),
        digest: digest(body),
        blank: value["version"].as_u64().is_some_and(|v| v >= 4)
            && nothing_in("resources")
            && nothing_in("outputs")
            && value.get("modules").is_none()
            && value.get("encrypted_data").is_none(),
    }
}

/// A state body unique to its writer: `pad` bytes of filler make some
/// states cross the 64 KiB the stale-write guard reads first.
pub fn state_body(lineage: &str, serial: u64, writer: &str, pad: usize) -> Vec<u8> {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{"writer":{{"type":"string","value":"{writer}"}},"pad":{{"type":"string","value":"{}"}}}},"resources":[]}}"#,
        "x".repeat(pad)
    )
    .into_bytes()
}

/// The same state as OpenTofu's client-side encryption sends it
/// (`tests/integration/opentofu.rs` builds real ones): an envelope whose
/// only clear fields are `serial` and `lineage`. The server cannot look
/// inside, so stand-in ciphertext (the plain body, base64'd) is as good.
pub fn opaque_body(lineage: &str, serial: u64, writer: &str, pad: usize) -> Vec<u8> {
    let sealed =
        base64::engine::general_purpose::STANDARD.encode(state_body(lineage, serial, writer, pad));
    format!(
        r#"{{"serial":{serial},"lineage":"{lineage}","meta":{{"key_provider.pbkdf2.chaos":"eyJzYWx0IjoiY2hhb3MifQ=="}},"encrypted_data":"{sealed}","encryption_version":"v0"}}"#
    )
    .into_bytes()
}

/// A legacy format-3 state (Terraform ≤ 0.11): its outputs and resources
/// sit under `modules`.
pub fn v3_body(lineage: &str, serial: u64, writer: &str, pad: usize) -> Vec<u8> {
    format!(
        r#"{{"version":3,"terraform_version":"0.11.14","serial":{serial},"lineage":"{lineage}","modules":[{{"path":["root"],"outputs":{{"writer":{{"sensitive":false,"type":"string","value":"{writer}"}},"pad":{{"sensitive":false,"type":"string","value":"{}"}}}},"resources":{{}},"depends_on":[]}}]}}"#,
        "x".repeat(pad)
    )
    .into_bytes()
}

/// One client: its own generator, the shared history and hosts.
pub struct Client {
    /// Its number in the history.
    pub id: usize,
    /// Its choices.
    pub rng: Rng,
    /// Where it records.
    pub recorder: Arc<Recorder>,
    /// Where it sends.
    pub hosts: Arc<Hosts>,
    /// The backend it writes.
    pub backend: String,
    /// The workspaces it picks from.
    pub workspaces: Vec<String>,
    pub(super) http: reqwest::blocking::Client,
    ops: u64,
    /// States it wrote and had acknowledged, by workspace (a few each):
    /// the backups an operator pushes again after deleting the state.
    pub(super) backups: std::collections::HashMap<String, Vec<(Written, Vec<u8>)>>,
}

impl Client {
    /// Client `id` with `seed`.
    pub fn new(
        id: usize,
        seed: u64,
        recorder: Arc<Recorder>,
        hosts: Arc<Hosts>,
        backend: &str,
        workspaces: Vec<String>,
    ) -> Client {
        Client {
            id,
            rng: Rng::new(seed),
            recorder,
            hosts,
            backend: backend.into(),
            workspaces,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            ops: 0,
            backups: Default::default(),
        }
    }

    /// Act until `until`: mostly Terraform's lock → read → write → unlock,
    /// with unlocked writers, plain reads, force-unlocks, workspace deletes
    /// and bodies cut short mixed in, and what operators and other teams
    /// do beside them ([`super::operators`]): a state deleted under a lock
    /// (and a backup pushed again), a second writer of another lineage, a
    /// workspace deleted and created again through the API.
    pub fn run(&mut self, until: Instant) {
        while Instant::now() < until {
            let workspace = self.workspaces[self.rng.below(self.workspaces.len())].clone();
            match self.rng.below(100) {
                0..45 => self.locked_write(&workspace),
                45..47 => self.delete_under_lock(&workspace),
                47..49 => self.second_lineage(&workspace),
                49..51 => self.recreate_workspace(super::operators::API_WORKSPACE),
                51..55 => self.race(&workspace),
                55..75 => self.unlocked_write(&workspace),
                75..85 => {
                    self.get(&workspace);
                }
                85..88 => self.pull_backup(&workspace),
                88..93 => self.force_unlock(&workspace),
                93..96 => self.delete_workspace(&workspace),
                96..98 => self.hang_up(&workspace, true),
                _ => self.hang_up(&workspace, false),
            }
        }
    }

    pub(super) fn next_name(&mut self) -> String {
        self.ops += 1;
        format!("c{}-{}", self.id, self.ops)
    }

    /// Terraform's apply: lock, read, write the next serial, unlock.
    pub fn locked_write(&mut self, workspace: &str) {
        let id = self.next_name();
        let lock = self.send(
            workspace,
            Op::Lock(id.clone()),
            "LOCK",
            Some(lock_info(&id)),
        );
        if !lock.is(200) {
            return;
        }
        if let Some(base) = self.get(workspace) {
            self.post(workspace, &base, Some(&id));
        }
        self.send(
            workspace,
            Op::Unlock(id.clone()),
            "UNLOCK",
            Some(lock_info(&id)),
        );
    }

    /// `terraform force-unlock`: UNLOCK without a body.
    pub fn force_unlock(&mut self, workspace: &str) {
        self.send(workspace, Op::ForceUnlock, "UNLOCK", None);
    }

    /// `-lock=false`: read, write the next serial.
    fn unlocked_write(&mut self, workspace: &str) {
        if let Some(base) = self.get(workspace) {
            self.post(workspace, &base, None);
        }
    }

    /// Two `-lock=false` writers from one serial at once, each through
    /// its own host (two when two are up): exactly one may be
    /// acknowledged, the other refused as stale (409), whether a host
    /// takes a lock for each (a guest before contract 0.3.0) or the
    /// storage's conditional write decides (0.3.0).
    fn race(&mut self, workspace: &str) {
        let Some(base) = self.get(workspace) else {
            return;
        };
        let up = self.hosts.up();
        if up.is_empty() {
            return;
        }
        let first = self.rng.below(up.len());
        let second = match up.len() {
            1 => first,
            n => (first + 1 + self.rng.below(n - 1)) % n,
        };
        let racers: Vec<_> = [first, second]
            .into_iter()
            .map(|i| {
                let (written, body) = self.written_as(workspace, &base, None, Some("race"));
                (up[i].clone(), written, body)
            })
            .collect();
        let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
            let racing: Vec<_> = racers
                .into_iter()
                .map(|((host, url), written, body)| {
                    let (http, recorder, id) = (self.http.clone(), self.recorder.clone(), self.id);
                    let url = format!("{url}/states/{}/{workspace}", self.backend);
                    scope.spawn(move || {
                        recorder.record(id, host, workspace, Op::Post(written), || {
                            let sent = http
                                .post(&url)
                                .header("Content-Type", "application/json")
                                .body(body)
                                .send();
                            answer(sent, false)
                        })
                    })
                })
                .collect();
            racing.into_iter().map(|r| r.join().unwrap()).collect()
        });
        self.recorder.races.lock().unwrap().tally(&outcomes);
    }

    /// The state now, as (lineage, serial) to write on top of: a new
    /// lineage when there is none. `None` when the read failed.
    pub fn get(&mut self, workspace: &str) -> Option<(String, u64)> {
        match self.send(workspace, Op::Get, "GET", None) {
            Outcome::Answered(200, Some(seen)) => Some((seen.lineage, seen.serial)),
            Outcome::Answered(404, _) => Some((format!("l-{}", self.next_name()), 0)),
            _ => None,
        }
    }

    fn written(
        &mut self,
        workspace: &str,
        base: &(String, u64),
        lock_id: Option<&str>,
    ) -> (Written, Vec<u8>) {
        self.written_as(workspace, base, lock_id, None)
    }

    /// The next state on top of `base`, shaped as `shape` says ("opaque",
    /// "v3", "" for plain), or at random.
    pub(super) fn written_as(
        &mut self,
        workspace: &str,
        base: &(String, u64),
        lock_id: Option<&str>,
        shape: Option<&'static str>,
    ) -> (Written, Vec<u8>) {
        let writer = format!("{}@{workspace}", self.next_name());
        // Now and then a state past the 64 KiB the guard reads first.
        let pad = if self.rng.below(8) == 0 {
            70 << 10
        } else {
            self.rng.below(512)
        };
        // OpenTofu-encrypted clients, and now and then a legacy state:
        // bodies the guard cannot see into, on the same lineages.
        let shape = shape.unwrap_or_else(|| match self.rng.below(16) {
            0..3 => "opaque",
            3 => "v3",
            _ => "",
        });
        let body = match shape {
            "opaque" => opaque_body(&base.0, base.1 + 1, &writer, pad),
            "v3" => v3_body(&base.0, base.1 + 1, &writer, pad),
            _ => state_body(&base.0, base.1 + 1, &writer, pad),
        };
        let written = Written {
            lineage: base.0.clone(),
            serial: base.1 + 1,
            digest: digest(&body),
            lock_id: lock_id.map(str::to_string),
            shape,
        };
        (written, body)
    }

    /// POST the next serial on top of `base`.
    pub fn post(
        &mut self,
        workspace: &str,
        base: &(String, u64),
        lock_id: Option<&str>,
    ) -> Outcome {
        let (written, body) = self.written(workspace, base, lock_id);
        self.post_body(workspace, written, body)
    }

    /// POST `body` (described by `written`, whose lock id it sends), and
    /// keep it as a backup when it is acknowledged.
    pub(super) fn post_body(
        &mut self,
        workspace: &str,
        written: Written,
        body: Vec<u8>,
    ) -> Outcome {
        let query = written
            .lock_id
            .as_ref()
            .map(|id| format!("?ID={id}"))
            .unwrap_or_default();
        let outcome = self.send_to(
            workspace,
            Op::Post(written.clone()),
            "POST",
            &query,
            Some(body.clone()),
        );
        if outcome.is(200) {
            self.keep_backup(workspace, written, body);
        }
        outcome
    }

    /// Keep `body` as a backup of `workspace` (a few each, the oldest
    /// replaced at random).
    pub(super) fn keep_backup(&mut self, workspace: &str, written: Written, body: Vec<u8>) {
        let kept = self.backups.entry(workspace.to_string()).or_default();
        if kept.len() < 4 {
            kept.push((written, body));
        } else {
            let slot = self.rng.below(kept.len());
            kept[slot] = (written, body);
        }
    }

    pub(super) fn delete_workspace(&mut self, workspace: &str) {
        let (host, base) = self.hosts.pick(&mut self.rng);
        let url = format!("{base}/workspaces/{}/{workspace}", self.backend);
        let http = self.http.clone();
        self.recorder
            .record(self.id, host, workspace, Op::DeleteWorkspace, || {
                answer(http.delete(&url).send(), false)
            });
    }

    /// A POST whose client hangs up: after half its body (which must never
    /// be stored), or after all of it without waiting for the answer (an
    /// unlocked write the server must finish whole, lock released).
    fn hang_up(&mut self, workspace: &str, whole: bool) {
        let base = match whole {
            true => match self.get(workspace) {
                Some(base) => base,
                None => return,
            },
            false => (format!("partial-{}", self.next_name()), 0),
        };
        let (written, body) = self.written(workspace, &base, None);
        let (op, sent) = match whole {
            true => (Op::Post(written), body.len()),
            false => (Op::PartialPost(written), body.len() / 2),
        };
        let (host, url) = self.hosts.pick(&mut self.rng);
        let path = format!("/states/{}/{workspace}", self.backend);
        self.recorder.record(self.id, host, workspace, op, || {
            let address = url.trim_start_matches("http://");
            let result = std::net::TcpStream::connect(address).and_then(|mut stream| {
                // The fault itself: a request, all or half of its body,
                // then the connection closes without reading the answer.
                write!(
                    stream,
                    "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )?;
                stream.write_all(&body[..sent])?;
                stream.shutdown(std::net::Shutdown::Both)
            });
            Outcome::Unknown(match result {
                Ok(()) => "client hung up".into(),
                Err(e) => format!("could not connect: {e}"),
            })
        });
    }

    pub(super) fn send(
        &mut self,
        workspace: &str,
        op: Op,
        method: &str,
        body: Option<Vec<u8>>,
    ) -> Outcome {
        self.send_to(workspace, op, method, "", body)
    }

    pub(super) fn send_to(
        &mut self,
        workspace: &str,
        op: Op,
        method: &str,
        query: &str,
        body: Option<Vec<u8>>,
    ) -> Outcome {
        let (host, base) = self.hosts.pick(&mut self.rng);
        let url = format!("{base}/states/{}/{workspace}{query}", self.backend);
        let is_get = op == Op::Get;
        let request = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            &url,
        );
        let request = match body {
            Some(body) => request
                .header("Content-Type", "application/json")
                .body(body),
            None => request,
        };
        self.recorder.record(self.id, host, workspace, op, || {
            answer(request.send(), is_get)
        })
    }
}

/// A lock's body as Terraform sends it.
pub(super) fn lock_info(id: &str) -> Vec<u8> {
    crate::common::lock_info(id, "chaos@checker")
}

/// The operation named in the lock a host takes for an unlocked write.
const HOST_LOCK: &[u8] = b"\"wasmstate-unlocked-write\"";

/// The outcome of a request: for a GET answered 200, the state it returned.
pub(super) fn answer(sent: reqwest::Result<reqwest::blocking::Response>, is_get: bool) -> Outcome {
    answer_keeping(sent, is_get, &mut None)
}

/// [`answer`], keeping in `kept` the state a GET answered 200 returned.
pub(super) fn answer_keeping(
    sent: reqwest::Result<reqwest::blocking::Response>,
    is_get: bool,
    kept: &mut Option<Vec<u8>>,
) -> Outcome {
    let response = match sent {
        Ok(response) => response,
        Err(e) => return Outcome::Unknown(one_line(&e)),
    };
    let status = response.status().as_u16();
    match response.bytes() {
        Ok(body) if is_get && status == 200 => {
            let seen = seen(&body);
            *kept = Some(body.to_vec());
            Outcome::Answered(200, Some(seen))
        }
        // The lock a host takes for an unlocked write (a guest before
        // contract 0.3.0), told from a client's.
        Ok(body) if status == 423 && body.windows(HOST_LOCK.len()).any(|w| w == HOST_LOCK) => {
            Outcome::HeldByHost
        }
        Ok(body) if status >= 500 => {
            let said = String::from_utf8_lossy(&body);
            Outcome::Failed(status, one_line(&said).chars().take(400).collect())
        }
        Ok(_) => Outcome::Answered(status, None),
        // The status came, the body did not: for a GET, no state was seen.
        Err(e) if is_get => Outcome::Unknown(one_line(&e)),
        Err(_) => Outcome::Answered(status, None),
    }
}

fn one_line(error: &dyn std::fmt::Display) -> String {
    error.to_string().replace('\n', " ")
}

/// `wasmstate state reseal`'s calls, one workspace at a time, against
/// random hosts until `until`; how many were answered 200, and in how
/// many the state was sealed again. Its writes are not in the history: a
/// re-seal writes the same state, so any older or lost state a client
/// then reads is an anomaly of the run.
pub fn reseal_along(
    hosts: &Hosts,
    mut rng: Rng,
    workspaces: &[String],
    backend: &str,
    until: Instant,
) -> (usize, usize) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (mut answered, mut resealed) = (0, 0);
    while Instant::now() < until {
        let workspace = &workspaces[rng.below(workspaces.len())];
        let (_, url) = hosts.pick(&mut rng);
        let answer = http
            .post(format!("{url}/states/{backend}/{workspace}/reseal"))
            .send();
        // Hosts are killed under it: a lost answer is a fault, not a finding.
        let Ok(answer) = answer else { continue };
        if !answer.status().is_success() {
            continue;
        }
        answered += 1;
        let report: serde_json::Value = answer.json().unwrap_or_default();
        if report["state"]["outcome"] == "resealed" {
            resealed += 1;
        }
    }
    (answered, resealed)
}
