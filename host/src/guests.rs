//! The first-party guests compiled into this binary, and loading a guest's
//! component bytes from wherever the config says it lives.

use crate::config::GuestSource;

/// A guest component shipped inside the `wasmstate` binary.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedGuest {
    /// The name used in config files: `guest = "local"`.
    pub name: &'static str,
    /// One line on what it stores and where.
    pub summary: &'static str,
    /// The component's bytes.
    pub wasm: &'static [u8],
}

/// Every embedded guest. The build script compiles each from `guests/<name>`.
pub const EMBEDDED: &[EmbeddedGuest] = &[EmbeddedGuest {
    name: "local",
    summary: "state files in a directory on this machine (the default)",
    wasm: include_bytes!(env!("WASMSTATE_GUEST_LOCAL")),
}];

/// The embedded guest called `name`, if there is one.
pub fn embedded(name: &str) -> Option<&'static EmbeddedGuest> {
    EMBEDDED.iter().find(|g| g.name == name)
}

/// Names of the embedded guests, for error messages.
pub fn embedded_names() -> Vec<&'static str> {
    EMBEDDED.iter().map(|g| g.name).collect()
}

/// The component bytes of `source`.
pub fn load(source: &GuestSource) -> anyhow::Result<std::borrow::Cow<'static, [u8]>> {
    match source {
        GuestSource::Embedded(name) => embedded(name)
            .map(|g| std::borrow::Cow::Borrowed(g.wasm))
            .ok_or_else(|| anyhow::anyhow!("no embedded guest named {name:?}")),
        GuestSource::File(path) => std::fs::read(path)
            .map(std::borrow::Cow::Owned)
            .map_err(|e| anyhow::anyhow!("cannot read guest {}: {e}", path.display())),
    }
}
