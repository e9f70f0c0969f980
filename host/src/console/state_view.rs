//! What a state holds, read in one pass over its bytes without building a
//! tree of it: serde visitors walk the JSON, count every resource and its
//! instances, keep only the rows of the page asked for, and borrow output
//! values from the bytes (cut to a few KiB) instead of copying them. A
//! 100 MiB state costs its bytes and a page's worth of rows, not a
//! `serde_json::Value` several times its size.
//!
//! The same walk answers the console's search ([`find`]): which resources
//! of a state have an address or type.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

/// Resources on one page of the viewer.
pub const RESOURCES_PER_PAGE: usize = 100;
/// Most (module, type) groups counted; past it, the table says it is cut.
pub const MAX_GROUPS: usize = 500;
/// Most outputs listed (in the state's order); all are counted.
pub const MAX_OUTPUTS: usize = 200;
/// Most bytes of an output's value shown.
pub const OUTPUT_SHOWN_BYTES: usize = 2048;
/// Most matching resources named per state by a search.
pub const MAX_MATCHES: usize = 20;

/// One resource as the walk meets it, borrowed from the state's bytes.
#[derive(Deserialize)]
struct ResourceHead<'a> {
    #[serde(borrow, default)]
    module: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    mode: Cow<'a, str>,
    #[serde(borrow, rename = "type", default)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    provider: Cow<'a, str>,
    /// How many instances (each skipped unread).
    #[serde(default)]
    instances: Option<Count>,
}

impl ResourceHead<'_> {
    /// `module.net.data.http.c`, as `terraform state list` prints it
    /// without the instance key.
    fn address(&self) -> String {
        let mut address = String::new();
        if let Some(module) = self.module.as_deref().filter(|m| !m.is_empty()) {
            address.push_str(module);
            address.push('.');
        }
        if self.mode == "data" {
            address.push_str("data.");
        }
        address.push_str(&self.kind);
        address.push('.');
        address.push_str(&self.name);
        address
    }

    fn instances(&self) -> usize {
        self.instances.as_ref().map_or(0, |c| c.0)
    }
}

/// The number of elements of a JSON array, each skipped.
struct Count(usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counter;
        impl<'de> Visitor<'de> for Counter {
            type Value = usize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of instances")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(n)
            }
        }
        d.deserialize_seq(Counter).map(Count)
    }
}

/// One output, its value borrowed from the bytes (`sensitive` comes after
/// `value` in Terraform's states, so masking waits for the whole object).
#[derive(Deserialize)]
struct OutputHead<'a> {
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
    #[serde(borrow, rename = "type", default)]
    kind: Option<&'a RawValue>,
    #[serde(default)]
    sensitive: bool,
}

/// The top-level fields the walk looks at; every other one is skipped.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    Version,
    TerraformVersion,
    Serial,
    Lineage,
    EncryptionVersion,
    Resources,
    Outputs,
    #[serde(other)]
    Other,
}

/// What a state says of itself.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Head {
    /// Encrypted by OpenTofu (a non-empty `encryption_version`, OpenTofu's
    /// own rule): only its clients can read what it holds.
    pub encrypted: bool,
    /// The state format (`version`, 4 today).
    pub format: Option<u64>,
    /// The Terraform or OpenTofu version that wrote it.
    pub terraform_version: Option<String>,
    /// `serial`.
    pub serial: Option<u64>,
    /// `lineage`.
    pub lineage: Option<String>,
}

type OnResource<'s, 'a> = &'s mut dyn FnMut(ResourceHead<'a>);
type OnOutput<'s, 'a> = Option<&'s mut dyn FnMut(String, OutputHead<'a>)>;

/// The walk over a whole state: the head kept, resources and outputs
/// handed to the callbacks one at a time (outputs skipped without one).
struct Walk<'s, 'a> {
    on_resource: OnResource<'s, 'a>,
    on_output: OnOutput<'s, 'a>,
}

impl<'a> DeserializeSeed<'a> for Walk<'_, 'a> {
    type Value = Head;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Head, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'a> Visitor<'a> for Walk<'_, 'a> {
    type Value = Head;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Terraform state (a JSON object)")
    }
    fn visit_map<M: MapAccess<'a>>(mut self, mut map: M) -> Result<Head, M::Error> {
        let mut head = Head::default();
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Version => head.format = map.next_value()?,
                Field::TerraformVersion => head.terraform_version = map.next_value()?,
                Field::Serial => head.serial = map.next_value()?,
                Field::Lineage => {
                    let lineage: Option<String> = map.next_value()?;
                    head.lineage = lineage.filter(|l| !l.is_empty());
                }
                Field::EncryptionVersion => {
                    let marker: Option<Cow<'a, str>> = map.next_value()?;
                    head.encrypted = marker.is_some_and(|m| !m.is_empty());
                }
                Field::Resources => map.next_value_seed(Resources(&mut *self.on_resource))?,
                Field::Outputs => match self.on_output.as_deref_mut() {
                    Some(on_output) => map.next_value_seed(Outputs(on_output))?,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(head)
    }
}

struct Resources<'s, 'a>(&'s mut dyn FnMut(ResourceHead<'a>));

impl<'a> DeserializeSeed<'a> for Resources<'_, 'a> {
    type Value = ();
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'a> Visitor<'a> for Resources<'_, 'a> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of resources")
    }
    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(resource) = seq.next_element::<ResourceHead<'a>>()? {
            (self.0)(resource);
        }
        Ok(())
    }
}

struct Outputs<'s, 'a>(&'s mut dyn FnMut(String, OutputHead<'a>));

impl<'a> DeserializeSeed<'a> for Outputs<'_, 'a> {
    type Value = ();
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'a> Visitor<'a> for Outputs<'_, 'a> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of outputs")
    }
    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<(), M::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let output = map.next_value::<OutputHead<'a>>()?;
            (self.0)(name, output);
        }
        Ok(())
    }
}

/// Walk `bytes` once; `Err` says in one line why they are not a state.
fn walk<'s, 'a>(
    bytes: &'a [u8],
    on_resource: OnResource<'s, 'a>,
    on_output: OnOutput<'s, 'a>,
) -> Result<Head, String> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let head = Walk {
        on_resource,
        on_output,
    }
    .deserialize(&mut json)
    .and_then(|head| json.end().map(|()| head))
    .map_err(|e| {
        // Never serde's own words: they quote the offending value, which
        // may be a secret.
        let what = match e.classify() {
            serde_json::error::Category::Syntax => "not valid JSON",
            serde_json::error::Category::Eof => "JSON cut short",
            serde_json::error::Category::Data => "JSON of another shape",
            serde_json::error::Category::Io => "unreadable",
        };
        format!(
            "not a Terraform state: {what} at line {} column {}",
            e.line(),
            e.column()
        )
    })?;
    if !head.encrypted && head.format != Some(4) {
        return Err(match head.format {
            Some(v) => format!(
                "a state of format {v}: only format 4 (Terraform ≥ 0.12, OpenTofu) is shown"
            ),
            None => "not a Terraform state (it has no \"version\") nor an OpenTofu encrypted state"
                .into(),
        });
    }
    Ok(head)
}

/// One resource on a page of the viewer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ResourceRow {
    /// Its module (`module.net`), empty for the root module.
    pub module: String,
    /// Its address, without instance keys.
    pub address: String,
    /// `managed` or `data`.
    pub mode: String,
    /// Its type (`aws_s3_bucket`).
    pub kind: String,
    /// Its provider, as the state names it.
    pub provider: String,
    /// How many instances it has (`count`, `for_each`).
    pub instances: usize,
}

/// The resources of one module and type.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Group {
    /// The module, empty for the root module.
    pub module: String,
    /// The type (`data.` in front for data sources).
    pub kind: String,
    /// How many resources.
    pub resources: usize,
    /// How many instances, all of them together.
    pub instances: usize,
}

/// One output, its value masked when sensitive.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OutputRow {
    /// Its name.
    pub name: String,
    /// Its type, as JSON (`"string"`, `["list","number"]`).
    pub kind: Option<String>,
    /// Marked sensitive: its value is never shown.
    pub sensitive: bool,
    /// Its value as JSON, the first [`OUTPUT_SHOWN_BYTES`] of it; `None`
    /// when sensitive.
    pub value: Option<String>,
    /// Whether the value was cut.
    pub cut: bool,
}

/// What a state holds: its head, its resources grouped and one page of
/// them, its outputs.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct StateView {
    /// What it says of itself.
    #[serde(flatten)]
    pub head: Head,
    /// Resources in all.
    pub resources_total: usize,
    /// Resource instances in all.
    pub instances_total: usize,
    /// Resources by module and type, sorted.
    pub groups: Vec<Group>,
    /// More groups than [`MAX_GROUPS`]: those past it are not counted.
    pub groups_cut: bool,
    /// This page's resources, in the state's order.
    pub resources: Vec<ResourceRow>,
    /// This page, from 1.
    pub page: usize,
    /// How many pages of [`RESOURCES_PER_PAGE`].
    pub pages: usize,
    /// The first [`MAX_OUTPUTS`] outputs.
    pub outputs: Vec<OutputRow>,
    /// Outputs in all.
    pub outputs_total: usize,
}

/// The first `max` bytes of `text`, cut at a character boundary.
pub fn cut_text(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

/// What `bytes` hold, with page `page` (from 1) of their resources.
pub fn summarise(bytes: &[u8], page: usize) -> Result<StateView, String> {
    let view = summarise_page(bytes, page.max(1))?;
    // A page past the end shows the last one (known only after a walk).
    if view.page > view.pages {
        return summarise_page(bytes, view.pages);
    }
    Ok(view)
}

fn summarise_page(bytes: &[u8], page: usize) -> Result<StateView, String> {
    let first = (page - 1).saturating_mul(RESOURCES_PER_PAGE);
    let (mut total, mut instances) = (0usize, 0usize);
    let mut groups: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    let mut groups_cut = false;
    let mut rows = Vec::new();
    let mut on_resource = |r: ResourceHead<'_>| {
        let count = r.instances();
        let module = r.module.as_deref().unwrap_or("").to_string();
        let kind = match r.mode == "data" {
            true => format!("data.{}", r.kind),
            false => r.kind.to_string(),
        };
        let key = (module, kind);
        if let Some(group) = groups.get_mut(&key) {
            *group = (group.0 + 1, group.1 + count);
        } else if groups.len() < MAX_GROUPS {
            groups.insert(key.clone(), (1, count));
        } else {
            groups_cut = true;
        }
        if (first..first.saturating_add(RESOURCES_PER_PAGE)).contains(&total) {
            rows.push(ResourceRow {
                module: key.0,
                address: r.address(),
                mode: r.mode.to_string(),
                kind: r.kind.to_string(),
                provider: r.provider.to_string(),
                instances: count,
            });
        }
        total += 1;
        instances += count;
    };
    let (mut outputs, mut outputs_total) = (Vec::new(), 0usize);
    let mut on_output = |name: String, o: OutputHead<'_>| {
        outputs_total += 1;
        if outputs.len() >= MAX_OUTPUTS {
            return;
        }
        let (value, cut) = match (o.sensitive, o.value) {
            (true, _) | (_, None) => (None, false),
            (false, Some(raw)) => {
                let (shown, cut) = cut_text(raw.get(), OUTPUT_SHOWN_BYTES);
                (Some(shown.to_string()), cut)
            }
        };
        outputs.push(OutputRow {
            name,
            kind: o
                .kind
                .map(|k| cut_text(k.get(), OUTPUT_SHOWN_BYTES).0.to_string()),
            sensitive: o.sensitive,
            value,
            cut,
        });
    };
    let head = walk(bytes, &mut on_resource, Some(&mut on_output))?;
    Ok(StateView {
        head,
        resources_total: total,
        instances_total: instances,
        groups: groups
            .into_iter()
            .map(|((module, kind), (resources, instances))| Group {
                module,
                kind,
                resources,
                instances,
            })
            .collect(),
        groups_cut,
        resources: rows,
        page,
        pages: total.div_ceil(RESOURCES_PER_PAGE).max(1),
        outputs,
        outputs_total,
    })
}

/// The resources of one state a search matched.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Found {
    /// Encrypted by OpenTofu: not searched.
    pub encrypted: bool,
    /// The first [`MAX_MATCHES`] matching resource addresses.
    pub addresses: Vec<String>,
    /// How many matched in all.
    pub matched: usize,
}

/// Whether a resource at `address` of type `kind` is what `query` asks
/// for: its type (`aws_s3_bucket`, `data.http`), or its address, whole or
/// without its module path (`aws_s3_bucket.logs` finds
/// `module.a.aws_s3_bucket.logs`); an instance key in the query is
/// ignored, resources are matched whole.
fn matches(query: &str, r: &ResourceHead<'_>) -> bool {
    let query = query.split('[').next().unwrap_or(query);
    let address = r.address();
    let module = r.module.as_deref().filter(|m| !m.is_empty());
    // The address within its module: `aws_s3_bucket.logs`, `data.http.c`.
    let local = match module {
        Some(m) => &address[m.len() + 1..],
        None => address.as_str(),
    };
    let typed = match r.mode == "data" {
        true => format!("data.{}", r.kind),
        false => r.kind.to_string(),
    };
    query == typed
        || query == local
        || query == address
        // A module path's tail: `module.b.x.y` in `module.a.module.b`.
        || query.starts_with("module.") && address.ends_with(&format!(".{query}"))
}

/// The resources of `bytes` whose address or type is `query`.
pub fn find(bytes: &[u8], query: &str) -> Result<Found, String> {
    let mut found = Found::default();
    let mut on_resource = |r: ResourceHead<'_>| {
        if matches(query, &r) {
            found.matched += 1;
            if found.addresses.len() < MAX_MATCHES {
                found.addresses.push(r.address());
            }
        }
    };
    let head = walk(bytes, &mut on_resource, None)?;
    found.encrypted = head.encrypted;
    Ok(found)
}

#[cfg(test)]
mod tests;
