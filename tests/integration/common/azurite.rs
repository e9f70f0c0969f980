//! Azurite, Microsoft's emulator of Azure Storage, for the `azure` guest:
//! its blob service, installed from npm at a pinned version into the
//! tests' tool folder (as the Python tools are), run on a loopback port
//! in a temporary folder, killed on drop.
//!
//! Terraform's `azurerm` backend cannot be pointed at Azurite (it has no
//! custom endpoint), so [`Azurite::native`] acts as it does: Microsoft's
//! Python SDK (`azure-storage-blob`, pinned in tests/tools/requirements.txt)
//! makes the same calls, with the same metadata and leases, as the
//! backend's `client.go`.

use super::process::Helper;
use super::tools;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The Azurite release the tests pin.
pub const AZURITE_VERSION: &str = "3.37.0";
/// Azurite's account.
pub const ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known account key (public, in Microsoft's docs).
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// `azurite-blob` from the pinned npm package, installed once per pin.
fn azurite_blob() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(install)
        .as_ref()
        .unwrap_or_else(|cause| panic!("{cause}"))
}

fn install() -> Result<PathBuf, String> {
    let package = serde_json::json!({
        "name": "wasmstate-test-azurite",
        "private": true,
        "dependencies": { "azurite": AZURITE_VERSION },
    })
    .to_string();
    let dir = tools::tool_dir(
        "azurite",
        &package,
        |dir| {
            eprintln!(
                "installing azurite {AZURITE_VERSION} from npm into {}",
                dir.display()
            );
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            std::fs::write(dir.join("package.json"), &package)
                .map_err(|e| format!("cannot write package.json: {e}"))?;
            let out = Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(dir)
                .output()
                .map_err(|e| {
                    format!("cannot run npm (the azure tests need Node.js and npm): {e}")
                })?;
            if out.status.success() {
                return Ok(());
            }
            Err(format!(
                "npm install azurite@{AZURITE_VERSION} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        },
        |dir| {
            let manifest = dir.join("node_modules/azurite/package.json");
            let text = std::fs::read_to_string(&manifest).map_err(|e| {
                format!(
                    "{}: {e}; delete {} and run the tests again",
                    manifest.display(),
                    dir.display()
                )
            })?;
            let have: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if have["version"] == AZURITE_VERSION {
                return Ok(());
            }
            Err(format!(
                "azurite {} is installed in {}, but the tests pin {AZURITE_VERSION}; delete that folder and run the tests again",
                have["version"],
                dir.display()
            ))
        },
    )?;
    Ok(dir.join("node_modules/.bin/azurite-blob"))
}

/// A throwaway Azurite blob service.
pub struct Azurite {
    _helper: Helper,
    _data: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Azurite {
    /// Start one and wait until its blob service answers.
    pub fn start() -> Azurite {
        let bin = azurite_blob();
        let data = super::tempdir();
        let (helper, ports) = Helper::start_on_free_ports(
            "azurite-blob",
            1,
            "answering its blob service",
            Duration::from_secs(60),
            |ports: &[u16]| {
                let mut command = Command::new(bin);
                command
                    .args(["--silent", "--skipApiVersionCheck"])
                    .args(["--blobHost", "127.0.0.1", "--blobPort"])
                    .arg(ports[0].to_string())
                    .arg("--location")
                    .arg(data.path());
                command
            },
            // Any answer is its own: an unsigned listing is refused (403).
            |ports: &[u16]| {
                reqwest::blocking::get(format!("http://127.0.0.1:{}/{ACCOUNT}?comp=list", ports[0]))
                    .is_ok_and(|r| r.status().as_u16() == 403)
            },
        );
        Azurite {
            _helper: helper,
            _data: data,
            port: ports[0],
        }
    }

    /// One serving HTTPS with `cert` and `key` (PEM, issued by the CA in
    /// `ca`, which its readiness probe trusts), checking bearer tokens as
    /// `--oauth basic` does: issuer, audience and lifetime, not the
    /// signature. Its base URL is [`Azurite::https_endpoint`].
    pub fn start_oauth(cert: &Path, key: &Path, ca: &Path) -> Azurite {
        let bin = azurite_blob();
        let data = super::tempdir();
        let roots = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
        let probe = reqwest::blocking::Client::builder()
            .add_root_certificate(roots)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let (helper, ports) = Helper::start_on_free_ports(
            "azurite-blob (https, oauth)",
            1,
            "answering its blob service over https",
            Duration::from_secs(60),
            |ports: &[u16]| {
                let mut command = Command::new(bin);
                command
                    .args(["--silent", "--skipApiVersionCheck", "--oauth", "basic"])
                    .arg("--cert")
                    .arg(cert)
                    .arg("--key")
                    .arg(key)
                    .args(["--blobHost", "127.0.0.1", "--blobPort"])
                    .arg(ports[0].to_string())
                    .arg("--location")
                    .arg(data.path());
                command
            },
            // Any answer over TLS is its own (an unsigned listing: 403).
            |ports: &[u16]| {
                probe
                    .get(format!(
                        "https://127.0.0.1:{}/{ACCOUNT}?comp=list",
                        ports[0]
                    ))
                    .send()
                    .is_ok()
            },
        );
        Azurite {
            _helper: helper,
            _data: data,
            port: ports[0],
        }
    }

    /// The blob service's base URL over https ([`Azurite::start_oauth`]).
    pub fn https_endpoint(&self) -> String {
        format!("https://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// The blob service's base URL, the guest's `blob_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// The connection string Microsoft's SDKs take.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={};",
            self.endpoint()
        )
    }

    /// Run one command of the native client ([`NATIVE`]) on `container`:
    /// its exit code (0 done, 3 refused for a lock, 4 no such blob) and
    /// the JSON it printed.
    pub fn native(&self, container: &str, args: &[&str]) -> (i32, serde_json::Value) {
        let out = Command::new(tools::python_env().python())
            .arg("-c")
            .arg(NATIVE)
            .arg(self.connection_string())
            .arg(container)
            .args(args)
            .output()
            .expect("the tests' Python runs");
        let code = out.status.code().unwrap_or(-1);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            matches!(code, 0 | 3 | 4),
            "native client {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let value = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
        (code, value)
    }

    /// Start one command of the native client and return once it printed
    /// its first line (`slow-lock`: the lease is taken, its info not yet
    /// written).
    pub fn native_spawn(&self, container: &str, args: &[&str]) -> NativeRun {
        use std::io::BufRead;
        let mut child = Command::new(tools::python_env().python())
            .arg("-c")
            .arg(NATIVE)
            .arg(self.connection_string())
            .arg(container)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the tests' Python runs");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        NativeRun { child, out, first }
    }

    /// [`Azurite::native`], which must succeed.
    pub fn native_ok(&self, container: &str, args: &[&str]) -> serde_json::Value {
        let (code, value) = self.native(container, args);
        assert_eq!(code, 0, "native client {args:?}: {value}");
        value
    }
}

/// A native client command under way ([`Azurite::native_spawn`]).
pub struct NativeRun {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    first: String,
}

impl NativeRun {
    /// Wait for it: its exit code and everything it printed.
    pub fn finish(mut self) -> (i32, String) {
        use std::io::Read;
        let mut rest = String::new();
        let _ = self.out.read_to_string(&mut rest);
        let status = self.child.wait().unwrap();
        (status.code().unwrap_or(-1), self.first + &rest)
    }
}

/// The native client: what Terraform's azurerm backend (`client.go`,
/// through giovanni) sends, made with Microsoft's Python SDK. Arguments:
/// connection string, container, command, the command's arguments.
const NATIVE: &str = r#"
import base64, json, sys
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobLeaseClient, BlobServiceClient, ContentSettings

conn, container, command, *args = sys.argv[1:]
service = BlobServiceClient.from_connection_string(conn)
c = service.get_container_client(container)
JSON = ContentSettings(content_type="application/json")
KEY = "terraformlockid"

def say(value):
    print(json.dumps(value))

def lock_info(blob, lease=None):
    # client.go getLockInfo
    raw = blob.get_blob_properties(lease=lease).metadata.get(KEY, "")
    return json.loads(base64.b64decode(raw)) if raw else None

def none(text):
    return None if text == "-" else text

if command == "create-container":
    c.create_container()
elif command == "lock":
    # client.go Lock: create the blob where missing, refuse a leased one,
    # acquire an infinite lease proposing the lock ID, record the info.
    name, info = args[0], json.loads(args[1])
    blob = c.get_blob_client(name)
    info["Path"] = f"{container}/{name}"
    try:
        leased = blob.get_blob_properties().lease.status == "locked"
    except ResourceNotFoundError:
        blob.upload_blob(b"", overwrite=True, content_settings=JSON)
        leased = False
    if leased:
        say({"locked": lock_info(blob)})
        sys.exit(3)
    try:
        lease = blob.acquire_lease(lease_duration=-1, lease_id=info["ID"])
    except HttpResponseError as e:
        say({"locked": lock_info(blob), "error": str(e.error_code)})
        sys.exit(3)
    info["ID"] = lease.id
    # client.go writeLockInfo: Go's json.Marshal, base64 std, other metadata kept
    metadata = dict(blob.get_blob_properties(lease=lease.id).metadata)
    metadata[KEY] = base64.b64encode(json.dumps(info, separators=(",", ":")).encode()).decode()
    blob.set_blob_metadata(metadata, lease=lease.id)
    say({"id": lease.id})
elif command == "unlock":
    # client.go Unlock (also what `terraform force-unlock ID` runs)
    name, lock_id = args
    blob = c.get_blob_client(name)
    info = lock_info(blob)
    if info is None or info["ID"] != lock_id:
        say({"mismatch": info})
        sys.exit(3)
    metadata = dict(blob.get_blob_properties(lease=lock_id).metadata)
    metadata.pop(KEY, None)
    blob.set_blob_metadata(metadata, lease=lock_id)
    BlobLeaseClient(blob, lease_id=lock_id).release()
    say({"released": lock_id})
elif command == "put":
    # client.go Put: snapshot first with `snapshot`, metadata resent, lease
    name, path, lease, snapshot = args
    blob = c.get_blob_client(name)
    if snapshot == "true":
        blob.create_snapshot(lease=none(lease))
    try:
        metadata = blob.get_blob_properties(lease=none(lease)).metadata
    except ResourceNotFoundError:
        metadata = {}
    with open(path, "rb") as f:
        data = f.read()
    blob.upload_blob(data, overwrite=True, content_settings=JSON, metadata=metadata, lease=none(lease))
    say({"written": len(data)})
elif command == "slow-lock":
    # client.go Lock's two steps with a pause between: the lease, a line
    # printed, `pause` seconds, then the lock info under the lease.
    name, info, pause = args[0], json.loads(args[1]), float(args[2])
    blob = c.get_blob_client(name)
    info["Path"] = f"{container}/{name}"
    lease = blob.acquire_lease(lease_duration=-1, lease_id=info["ID"])
    print(json.dumps({"leased": lease.id}), flush=True)
    import time
    time.sleep(pause)
    metadata = dict(blob.get_blob_properties(lease=lease.id).metadata)
    metadata[KEY] = base64.b64encode(json.dumps(info, separators=(",", ":")).encode()).decode()
    blob.set_blob_metadata(metadata, lease=lease.id)
    say({"id": lease.id})
elif command == "lease-only":
    # A lease taken by another tool: no lock info recorded.
    name, lease_id = args
    c.get_blob_client(name).acquire_lease(lease_duration=-1, lease_id=lease_id)
    say({"id": lease_id})
elif command == "break":
    # A lease broken by another tool, its lock info left behind.
    BlobLeaseClient(c.get_blob_client(args[0])).break_lease(lease_break_period=0)
    say({})
elif command == "set-metadata":
    name, metadata = args
    c.get_blob_client(name).set_blob_metadata(json.loads(metadata))
    say({})
elif command == "get":
    name, path = args
    try:
        data = c.get_blob_client(name).download_blob().readall()
    except ResourceNotFoundError:
        say(None)
        sys.exit(4)
    with open(path, "wb") as f:
        f.write(data)
    say({"bytes": len(data)})
elif command == "props":
    try:
        p = c.get_blob_client(args[0]).get_blob_properties()
    except ResourceNotFoundError:
        say(None)
        sys.exit(4)
    raw = p.metadata.get(KEY)
    say({
        "size": p.size,
        "content_type": p.content_settings.content_type,
        "lease_status": p.lease.status,
        "metadata": p.metadata,
        "lock": json.loads(base64.b64decode(raw)) if raw else None,
    })
elif command == "list":
    prefix, snapshots = args
    include = ["snapshots"] if snapshots == "true" else None
    say([
        {"name": b.name, "snapshot": b.snapshot, "size": b.size}
        for b in c.list_blobs(name_starts_with=prefix, include=include)
    ])
elif command == "sas":
    # A container SAS for what a state store does (no ACLs, no container
    # changes), as an operator would issue one for Terraform.
    import datetime
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    say(generate_container_sas(
        service.account_name, container,
        account_key=service.credential.account_key,
        permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
    ))
else:
    sys.exit(f"unknown command {command}")
"#;
