//! The one wasmtime [`Engine`] and its sandbox defaults, in one place.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: how often a running guest yields to the
/// executor, and the resolution of its deadline.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Most linear memories, tables and core instances a guest component may
/// have. A Rust guest built for wasm32-wasip2 has one memory and a few core
/// instances (its module plus wit-component's shims).
const MEMORIES_PER_COMPONENT: u32 = 2;
const CORE_INSTANCES_PER_COMPONENT: u32 = 8;
/// The most core instances (and tables) one component instance may take
/// from the pool, which holds `CORE_INSTANCES_PER_COMPONENT` per instance
/// slot: room for a guest linked from many modules (a Python or
/// JavaScript guest has a dozen or so), never the whole pool (wasmtime's
/// default is no bound: one guest with thousands of core instances would
/// leave none for any other backend's instances).
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 32;

/// Memory kept resident per pool slot between instances (reset in place
/// when an instance ends): a small request's heap then needs no page
/// faults. Only slots in use are touched (no warm slots are kept spare), so
/// an idle server holds little; the worst case is this times the pool size,
/// and the guest memory budget sets that aside ([`pool_resident_bytes`]).
const KEEP_RESIDENT_BYTES: usize = 1 << 20;
const TABLE_KEEP_RESIDENT_BYTES: usize = 64 << 10;
/// wasmtime's default stack for a guest call on the async executor; its
/// touched pages stay resident in the pool too.
const ASYNC_STACK_BYTES: usize = 2 << 20;

/// The most memory the instance pool keeps resident between requests with
/// `max_instances` slots: every memory slot's kept part, every table's,
/// and every stack.
pub fn pool_resident_bytes(max_instances: u32) -> u64 {
    let n = u64::from(max_instances);
    n * u64::from(MEMORIES_PER_COMPONENT) * KEEP_RESIDENT_BYTES as u64
        + n * u64::from(CORE_INSTANCES_PER_COMPONENT) * TABLE_KEEP_RESIDENT_BYTES as u64
        + n * ASYNC_STACK_BYTES as u64
}

/// What the engine is built from. The server and its compiler child
/// ([`super::compiler`]) build theirs from the same settings with
/// [`build`], so the child's machine code is what the server would have
/// compiled (and its compatibility hash, in the cache entry's name, the
/// same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineSettings {
    /// Instance pool slots.
    pub max_instances: u32,
    /// The largest linear memory of any backend.
    pub max_memory_bytes: u64,
    /// Whether this process's memory may be swapped (see [`build`]).
    pub swap_possible: bool,
}

impl EngineSettings {
    /// The engine these settings describe.
    pub fn build(&self) -> anyhow::Result<Engine> {
        build(
            self.max_instances,
            self.max_memory_bytes,
            self.swap_possible,
        )
    }
}

/// Build the engine:
/// - epoch interruption, so a guest in an endless loop is stopped at its
///   deadline (fuel would cost every instruction; epochs cost a check per
///   loop back-edge);
/// - the pooling allocator sized for `max_instances` concurrent instances,
///   with each memory slot as large as the largest per-backend limit, so
///   instantiation reuses warm slots instead of mmap-ing afresh;
/// - nothing the guests do not need: threads, GC and the rest are compiled
///   out by the crate features chosen in the workspace manifest.
///
/// Slots are shared by every backend's guests, so a slot must come back
/// clean. The fast reset (Linux 6.7+ PAGEMAP_SCAN: reset only the pages
/// the instance dirtied) skips dirty pages the kernel swapped out in
/// wasmtime 48 (upstream wasmtime PR #14357): the next instance in the
/// slot, of any backend, could read them. So it is used only where this
/// process's memory cannot be swapped (`swap_possible` false: no swap area,
/// or a cgroup that forbids swap); elsewhere every instance's kept memory
/// is reset with a memset, which has no such gap (and costs about 4x on a
/// small read, measured).
pub fn build(
    max_instances: u32,
    max_memory_bytes: u64,
    swap_possible: bool,
) -> anyhow::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(max_instances)
        .total_core_instances(max_instances * CORE_INSTANCES_PER_COMPONENT)
        .total_memories(max_instances * MEMORIES_PER_COMPONENT)
        .total_tables(max_instances * CORE_INSTANCES_PER_COMPONENT)
        .total_stacks(max_instances)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_tables_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memory_size(usize::try_from(max_memory_bytes)?)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES)
        // Reuse a slot that was used before rather than touching a fresh
        // one: the slots holding resident memory stay as few as the peak
        // of concurrent instances.
        .max_unused_warm_slots(0)
        .pagemap_scan(if swap_possible {
            Enabled::No
        } else {
            Enabled::Auto
        });

    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .async_stack_size(ASYNC_STACK_BYTES)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Ok(Engine::new(&config)?)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] on a background thread
/// until dropped.
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    /// Start ticking `engine`.
    pub fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("wasmstate-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawn epoch thread");
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component of `n` core instances of one small module (one table
    /// each): the module by wasm-encoder, the component's two sections
    /// (core module, core instances) by hand.
    fn component_of(n: u32) -> Vec<u8> {
        let mut tables = wasm_encoder::TableSection::new();
        tables.table(wasm_encoder::TableType {
            element_type: wasm_encoder::RefType::FUNCREF,
            minimum: 1,
            maximum: Some(1),
            table64: false,
            shared: false,
        });
        let mut module = wasm_encoder::Module::new();
        module.section(&tables);
        let module = module.finish();
        fn leb(mut n: usize, out: &mut Vec<u8>) {
            loop {
                let byte = (n & 0x7f) as u8;
                n >>= 7;
                out.push(if n == 0 { byte } else { byte | 0x80 });
                if n == 0 {
                    break;
                }
            }
        }
        // Each core instance: instantiate module 0 with no arguments.
        let mut instances = Vec::new();
        leb(n as usize, &mut instances);
        for _ in 0..n {
            instances.extend([0x00, 0x00, 0x00]);
        }
        let mut component = b"\0asm\x0d\x00\x01\x00".to_vec();
        for (id, body) in [(0x01, module), (0x02, instances)] {
            component.push(id);
            leb(body.len(), &mut component);
            component.extend(body);
        }
        component
    }

    /// One component may not take more of the pool's core instances than
    /// its bound, however large the pool.
    #[tokio::test]
    async fn a_component_with_too_many_core_instances_is_refused() {
        let engine = build(64, 1 << 20, true).unwrap();
        let linker = wasmtime::component::Linker::<()>::new(&engine);
        let instantiate = async |n: u32| {
            let component = wasmtime::component::Component::new(&engine, component_of(n))?;
            let mut store = wasmtime::Store::new(&engine, ());
            linker
                .instantiate_async(&mut store, &component)
                .await
                .map(|_| ())
        };
        instantiate(MAX_CORE_INSTANCES_PER_COMPONENT).await.unwrap();
        let refused = instantiate(MAX_CORE_INSTANCES_PER_COMPONENT + 1)
            .await
            .unwrap_err();
        assert!(
            format!("{refused:#}").contains("core module instances"),
            "{refused:#}"
        );
    }
}
