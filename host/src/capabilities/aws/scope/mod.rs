//! What the host signs for a backend's guest: only the calls a state store
//! makes, on the bucket, keys and table the backend's own configuration
//! names. The guest never holds the credentials, but without this it could
//! have the host sign anything for it on a granted origin: another bucket
//! through a path-style endpoint, a copy from another readable object
//! (`x-amz-copy-source`), a bucket policy or ACL (`?policy`, `?acl`), any
//! DynamoDB table, or, where it picked the service with `X-Amz-Target`, a
//! call to STS. The host picks the service, from the host name or the
//! endpoint the configuration gave for it, never from the guest's headers.

mod layout;

pub use layout::check_disjoint;

use crate::policy::Origin;

/// S3 query parameters of the calls a state store makes: object GET,
/// HEAD, PUT and DELETE, multipart uploads, listings, and reading the
/// bucket's history (its versioning setting, a key's versions, a version's
/// bytes). Any other (a subresource such as `policy`, `acl`, `tagging`,
/// `lifecycle`) is refused.
const S3_QUERY: &[&str] = &[
    "x-id",
    "list-type",
    "prefix",
    "delimiter",
    "continuation-token",
    "start-after",
    "max-keys",
    "encoding-type",
    "fetch-owner",
    "marker",
    "uploads",
    "uploadId",
    "partNumber",
    "key-marker",
    "upload-id-marker",
    "max-uploads",
    "versioning",
    "versions",
    "version-id-marker",
    "versionId",
];

/// S3 request headers setting who may read an object, how long it must
/// be kept, or its tags: a state store sets none of them, and each could
/// open a state to others or pin it against deletion.
const S3_REFUSED_HEADERS: &[&str] = &[
    "x-amz-acl",
    "x-amz-grant-",
    "x-amz-object-lock-",
    "x-amz-bucket-object-lock",
    "x-amz-tagging",
    "x-amz-website-redirect-location",
];

/// DynamoDB operations a lock table needs.
const DYNAMODB_CALLS: &[&str] = &["GetItem", "PutItem", "UpdateItem", "DeleteItem"];

/// The service a signed request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Amazon S3 (or a store speaking its API).
    S3,
    /// Amazon DynamoDB's JSON API.
    DynamoDb,
}

impl Service {
    /// Its SigV4 signing name.
    pub fn signing_name(self) -> &'static str {
        match self {
            Service::S3 => "s3",
            Service::DynamoDb => "dynamodb",
        }
    }
}

/// What one backend's signed requests may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SigningScope {
    /// `bucket` of the guest's configuration: the only one signed for.
    bucket: Option<String>,
    /// `key` and `workspace_key_prefix`: the keys signed for are the key,
    /// its lock file and everything under `<prefix>/`.
    key: Option<String>,
    workspace_prefix: String,
    /// `use_path_style`: the bucket is the path's first segment, whatever
    /// the host name.
    path_style: bool,
    /// `dynamodb_table`: the only table signed for.
    table: Option<String>,
    /// The endpoint named for DynamoDB (`endpoints.dynamodb`).
    dynamodb_origin: Option<Origin>,
    /// The guest is not first-party (installed, or a file): only the
    /// states its `key` names, never the whole bucket, even were a scope
    /// without a key to get past [`SigningScope::for_stranger`].
    stranger: bool,
}

impl SigningScope {
    /// The scope the guest configuration `config` (flattened keys) names.
    pub fn from_config(config: &[(String, String)]) -> SigningScope {
        let get = |name: &str| {
            config
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        SigningScope {
            bucket: get("bucket"),
            key: get("key"),
            workspace_prefix: get("workspace_key_prefix").unwrap_or_else(|| "env:".into()),
            path_style: get("use_path_style").is_some_and(|v| v.trim() == "true"),
            table: get("dynamodb_table"),
            dynamodb_origin: get("endpoints.dynamodb")
                .or_else(|| get("dynamodb_endpoint"))
                .and_then(|e| Origin::parse(e.trim_end_matches('/')).ok()),
            stranger: false,
        }
    }

    /// The scope of a guest that is not first-party: as
    /// [`SigningScope::from_config`], but only if the configuration names
    /// the states it reaches. Without a `key` a first-party guest refuses
    /// to start, and its scope would be the whole bucket (every object,
    /// every listing, every `LockID` under it): a stranger's guest would
    /// read, overwrite and delete other tenants' states with the host's
    /// credentials. An empty `workspace_key_prefix` would give it every
    /// `NAME/<key>` of the bucket and listings of all of it. `Err`: the
    /// config key at fault and what to write, in one line.
    pub fn for_stranger(config: &[(String, String)]) -> Result<SigningScope, String> {
        let scope = SigningScope {
            stranger: true,
            ..SigningScope::from_config(config)
        };
        const WHY: &str = "a guest that is not first-party gets AWS requests signed only for the states its config names";
        match scope.key.as_deref() {
            None | Some("") => {
                return Err(format!(
                    "key: missing: {WHY}; add key = \"PATH/terraform.tfstate\" (its default workspace's state object; other workspaces are <workspace_key_prefix>/NAME/<key>)"
                ));
            }
            Some(key) if !plain_path(key) => {
                return Err(format!(
                    "key: {key:?} is not an object key: {WHY}; write one such as \"team/terraform.tfstate\" (no leading, trailing or doubled '/', no '.' or '..' segment)"
                ));
            }
            Some(_) => {}
        }
        if scope.workspace_prefix.is_empty() {
            return Err(format!(
                "workspace_key_prefix: empty: {WHY}, and with no prefix they would be every NAME/<key> in the bucket; remove the setting (default \"env:\") or set a prefix of its own"
            ));
        }
        if !plain_path(&scope.workspace_prefix) {
            return Err(format!(
                "workspace_key_prefix: {:?} is not a key prefix: {WHY}; write one such as \"team-env\" (no leading, trailing or doubled '/', no '.' or '..' segment)",
                scope.workspace_prefix
            ));
        }
        // A `LockID` is `<bucket>/<key>`: a `/` in the bucket would make
        // another bucket's `LockID`s this backend's in a shared table.
        if let Some(bucket) = scope.bucket.as_deref().filter(|b| b.contains('/')) {
            return Err(format!(
                "bucket: {bucket:?} is not a bucket name: {WHY}; write the bucket's name alone (no '/')"
            ));
        }
        Ok(scope)
    }

    /// The service `request` is for, if it is one signed for this backend
    /// and within its scope; else why not, in one line.
    pub fn check(&self, request: &http::Request<bytes::Bytes>) -> Result<Service, String> {
        match self.service(request)? {
            Service::S3 => self.check_s3(request).map(|()| Service::S3),
            Service::DynamoDb => self.check_dynamodb(request).map(|()| Service::DynamoDb),
        }
    }

    fn service(&self, request: &http::Request<bytes::Bytes>) -> Result<Service, String> {
        // Before any service is picked: the checks read one value, a
        // service might act on another.
        if request.headers().get_all("x-amz-target").iter().count() > 1 {
            return Err("X-Amz-Target given twice".into());
        }
        let host = request.uri().host().unwrap_or_default();
        if let Some(name) = host.strip_suffix(".amazonaws.com") {
            for label in name.split('.') {
                match label.split('-').next().unwrap_or(label) {
                    "s3" => return Ok(Service::S3),
                    "dynamodb" => return Ok(Service::DynamoDb),
                    _ => {}
                }
            }
            return Err(format!(
                "{host} is not S3 or DynamoDB: the host signs nothing else for a guest"
            ));
        }
        let target = request
            .headers()
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok());
        let dynamodb_here = self
            .dynamodb_origin
            .as_ref()
            .is_some_and(|o| o.matches(request.uri()));
        match target {
            // The endpoint the configuration names for DynamoDB (S3 may
            // share it, as on moto) and DynamoDB's JSON protocol.
            Some(t) if dynamodb_here && t.starts_with("DynamoDB_20120810.") => {
                Ok(Service::DynamoDb)
            }
            Some(t) => Err(format!(
                "X-Amz-Target {t:?} on {host}: the host signs only S3, and DynamoDB on its configured endpoint"
            )),
            None => Ok(Service::S3),
        }
    }

    fn check_s3(&self, request: &http::Request<bytes::Bytes>) -> Result<(), String> {
        let Some(bucket) = &self.bucket else {
            return Err("the backend's config names no `bucket`: no S3 request is signed".into());
        };
        if !matches!(
            request.method().as_str(),
            "GET" | "HEAD" | "PUT" | "POST" | "DELETE"
        ) {
            return Err(format!(
                "S3 {} is not a state store's call",
                request.method()
            ));
        }
        if request
            .headers()
            .keys()
            .any(|h| h.as_str().starts_with("x-amz-copy-source"))
        {
            return Err("an S3 copy from another object is not a state store's call".into());
        }
        if let Some(h) = request
            .headers()
            .keys()
            .find(|h| S3_REFUSED_HEADERS.iter().any(|r| h.as_str().starts_with(r)))
        {
            return Err(format!(
                "S3 header {h} (access, retention or tags) is not a state store's call"
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (name, _) in form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes()) {
            if !S3_QUERY.contains(&name.as_ref()) {
                return Err(format!("S3 ?{name} is not a state store's call"));
            }
            // The check reads one value; a store might act on another.
            if !seen.insert(name.clone()) {
                return Err(format!("S3 ?{name} given twice"));
            }
        }
        // The bucket's versioning and its listings of versions are read on
        // the bucket itself, never on an object (where a store could take
        // them for something else).
        if (seen.contains("versioning") || seen.contains("versions"))
            && (request.method() != http::Method::GET || !self.bucket_level(request, bucket))
        {
            return Err("S3 ?versioning or ?versions other than a GET of the bucket is not a state store's call".into());
        }
        // Versions are read, never removed or changed: a DELETE of one
        // would erase the history every replica relies on for good.
        if seen.contains("versionId") && !matches!(request.method().as_str(), "GET" | "HEAD") {
            return Err(format!(
                "S3 {} of an object version is not a state store's call: versions are only read",
                request.method()
            ));
        }
        let host = request.uri().host().unwrap_or_default();
        let path = percent_decode(request.uri().path());
        // Path-style when the configuration says so (an endpoint whose
        // own name starts with the bucket's must not pass for
        // virtual-hosted); exactly one leading `/` is not part of the key.
        let rest = path.strip_prefix('/').unwrap_or(&path);
        let (asked_bucket, key) = if !self.path_style && host.starts_with(&format!("{bucket}.")) {
            (bucket.as_str(), rest)
        } else {
            rest.split_once('/').unwrap_or((rest, ""))
        };
        if asked_bucket != bucket {
            return Err(format!(
                "bucket {asked_bucket:?} is not the backend's ({bucket:?})"
            ));
        }
        if key.is_empty() {
            // The bucket itself: listings of the backend's own states and
            // HeadBucket, never creating, deleting or configuring it.
            return match request.method().as_str() {
                "HEAD" => Ok(()),
                "GET" => self.check_listing(request.uri().query().unwrap_or("")),
                m => Err(format!(
                    "S3 {m} on the bucket itself is not a state store's call"
                )),
            };
        }
        if self.key_allowed(key) {
            return Ok(());
        }
        Err(format!("key {key:?} is outside the backend's state layout"))
    }

    /// Whether `request` is for the bucket itself (no object key), as
    /// [`SigningScope::check_s3`] reads the path.
    fn bucket_level(&self, request: &http::Request<bytes::Bytes>, bucket: &str) -> bool {
        let host = request.uri().host().unwrap_or_default();
        let path = percent_decode(request.uri().path());
        let rest = path.strip_prefix('/').unwrap_or(&path);
        if !self.path_style && host.starts_with(&format!("{bucket}.")) {
            rest.is_empty()
        } else {
            rest.split_once('/').is_none_or(|(_, key)| key.is_empty())
        }
    }

    /// A listing (a GET of the bucket)'s `prefix` must stay within the
    /// backend's states: the workspaces' prefix and `/` for objects (the
    /// whole bucket when it is empty, never for a stranger), one of its
    /// keys for unfinished uploads and versions. Every key a listing
    /// returns then starts with `<prefix>/` or the backend's key: for a
    /// stranger, a namespace no other backend served on the bucket shares
    /// ([`check_disjoint`], at load).
    fn check_listing(&self, query: &str) -> Result<(), String> {
        if self.key.is_none() && !self.stranger {
            return Ok(());
        }
        let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        let has = |name: &str| params.iter().any(|(k, _)| k == name);
        let prefix = params
            .iter()
            .find(|(k, _)| k == "prefix")
            .map_or("", |(_, v)| v.as_str());
        // Any other GET of the bucket lists its objects (ListObjects v1
        // without a query): within the workspaces' prefix. Reading whether
        // the bucket keeps versions reads no object.
        let allowed = if has("versioning") {
            params.iter().all(|(k, _)| k == "versioning" || k == "x-id")
        } else if has("uploads") || has("versions") {
            self.key_allowed(prefix)
        } else {
            match self.workspace_prefix.as_str() {
                "" => !self.stranger,
                ws => prefix.strip_prefix(ws).is_some_and(|r| r.starts_with('/')),
            }
        };
        match allowed {
            true => Ok(()),
            false => Err(format!(
                "an S3 listing with prefix {prefix:?} reaches beyond the backend's states"
            )),
        }
    }

    /// A state key of this backend, its lock file or its workspace's
    /// metadata object (`.wasmstate-metadata`, contract 0.3.0) (every key,
    /// when the configuration of a first-party guest names no `key`: the
    /// guest refuses that anyway; none for another guest).
    fn key_allowed(&self, key: &str) -> bool {
        let state = [".tflock", ".wasmstate-metadata"]
            .iter()
            .find_map(|suffix| key.strip_suffix(suffix))
            .unwrap_or(key);
        self.state_key_allowed(state)
    }

    /// `key`, or `<workspace_key_prefix>/<workspace>/key` for one
    /// workspace (a name without `/`): Terraform's S3 layout. Another
    /// backend sharing the bucket under the same prefix with another key
    /// stays out of reach.
    fn state_key_allowed(&self, candidate: &str) -> bool {
        let Some(state_key) = &self.key else {
            return !self.stranger;
        };
        if candidate == state_key {
            return true;
        }
        let rest = match self.workspace_prefix.as_str() {
            "" => Some(candidate),
            prefix => candidate
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('/')),
        };
        // A stranger's workspace is never `.` or `..`: a store or proxy
        // normalising the path would take it for another key.
        rest.and_then(|r| r.split_once('/'))
            .is_some_and(|(workspace, key)| {
                !workspace.is_empty()
                    && key == state_key
                    && !(self.stranger && matches!(workspace, "." | ".."))
            })
    }

    /// A DynamoDB `LockID` of this backend: `<bucket>/<state key>`, or
    /// `<bucket>/<state key>-md5` (the digest item).
    fn lock_id_allowed(&self, bucket: &str, lock_id: &str) -> bool {
        let path = lock_id.strip_suffix("-md5").unwrap_or(lock_id);
        path.strip_prefix(bucket)
            .and_then(|p| p.strip_prefix('/'))
            .is_some_and(|key| self.state_key_allowed(key))
    }

    fn check_dynamodb(&self, request: &http::Request<bytes::Bytes>) -> Result<(), String> {
        let Some(table) = &self.table else {
            return Err(
                "the backend's config names no `dynamodb_table`: no DynamoDB request is signed"
                    .into(),
            );
        };
        let call = request
            .headers()
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .and_then(|t| t.strip_prefix("DynamoDB_20120810."))
            .unwrap_or_default();
        if !DYNAMODB_CALLS.contains(&call) {
            return Err(format!("DynamoDB {call} is not a lock table's call"));
        }
        #[derive(serde::Deserialize)]
        struct StringValue {
            #[serde(rename = "S")]
            s: String,
        }
        #[derive(serde::Deserialize)]
        struct LockId {
            #[serde(rename = "LockID")]
            lock_id: StringValue,
        }
        #[derive(serde::Deserialize)]
        struct Named {
            #[serde(rename = "TableName")]
            table: String,
            #[serde(rename = "Key")]
            key: Option<LockId>,
            #[serde(rename = "Item")]
            item: Option<LockId>,
        }
        let named: Named = serde_json::from_slice(request.body())
            .map_err(|_| format!("DynamoDB {call} without a TableName and a string LockID"))?;
        if &named.table != table {
            return Err(format!(
                "table {:?} is not the backend's ({table:?})",
                named.table
            ));
        }
        // PutItem writes its Item; the others act on their Key. The field
        // the call does not use must be absent, or it would be the one
        // checked while the other is acted on.
        let named_id = match (call, named.key, named.item) {
            ("PutItem", None, Some(item)) => item,
            ("GetItem" | "UpdateItem" | "DeleteItem", Some(key), None) => key,
            _ => {
                return Err(format!(
                    "DynamoDB {call} must name its LockID in {} alone",
                    if call == "PutItem" { "Item" } else { "Key" }
                ));
            }
        };
        let LockId { lock_id } = named_id;
        let bucket = self.bucket.as_deref().unwrap_or_default();
        if !self.lock_id_allowed(bucket, &lock_id.s) {
            return Err(format!(
                "LockID {:?} is not one of the backend's states",
                lock_id.s
            ));
        }
        Ok(())
    }
}

/// A key or prefix a store takes as written: no leading, trailing or
/// doubled `/`, no `.` or `..` segment (a store or proxy normalising the
/// path would take it for another).
fn plain_path(path: &str) -> bool {
    path.split('/')
        .all(|segment| !matches!(segment, "" | "." | ".."))
}

fn percent_decode(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests;
