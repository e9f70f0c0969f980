//! Stages 1 and 2 of loading: find a guest's bytes and verify them.

use crate::config::{Config, GuestSource};
use crate::guests::embedded;
use crate::marketplace::{Policy, load_installed, store::GuestStore};
use std::borrow::Cow;

/// The component bytes of `source`. An installed guest comes from the
/// store in `config`'s data directory and is verified again on every load:
/// its digest against the pin, its signature against the trusted keys.
pub fn resolve(source: &GuestSource, config: &Config) -> anyhow::Result<Cow<'static, [u8]>> {
    match source {
        GuestSource::Installed { name, sha256 } => {
            let policy = Policy::new(&config.marketplace).map_err(anyhow::Error::msg)?;
            let store = GuestStore::new(&config.data_dir);
            load_installed(&store, &policy, name, sha256)
                .map(Cow::Owned)
                .map_err(anyhow::Error::msg)
        }
        GuestSource::Embedded(name) => embedded(name)
            .map(|g| Cow::Borrowed(g.wasm))
            .ok_or_else(|| anyhow::anyhow!("no embedded guest named {name:?}")),
        GuestSource::File(path) => std::fs::read(path)
            .map(Cow::Owned)
            .map_err(|e| anyhow::anyhow!("cannot read guest {}: {e}", path.display())),
    }
}
