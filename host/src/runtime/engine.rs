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

/// Memory kept resident per pool slot between instances: covers a guest's
/// stack, heap and a state of a few MiB. Only slots in use are touched, so
/// an idle server holds little; the worst case is this times the pool size.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;
const TABLE_KEEP_RESIDENT_BYTES: usize = 64 << 10;

/// Build the engine:
/// - epoch interruption, so a guest in an endless loop is stopped at its
///   deadline (fuel would cost every instruction; epochs cost a check per
///   loop back-edge);
/// - the pooling allocator sized for `max_instances` concurrent instances,
///   with each memory slot as large as the largest per-backend limit, so
///   instantiation reuses warm slots instead of mmap-ing afresh;
/// - nothing the guests do not need: threads, GC and the rest are compiled
///   out by the crate features chosen in the workspace manifest.
pub fn build(max_instances: u32, max_memory_bytes: u64) -> anyhow::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(max_instances)
        .total_core_instances(max_instances * CORE_INSTANCES_PER_COMPONENT)
        .total_memories(max_instances * MEMORIES_PER_COMPONENT)
        .total_tables(max_instances * CORE_INSTANCES_PER_COMPONENT)
        .total_stacks(max_instances)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_memory_size(usize::try_from(max_memory_bytes)?)
        // A fresh instance per request would otherwise page-fault its memory
        // in and madvise it away again every time (half of a small GET's
        // cost, measured). Keep the first pages of each slot resident and
        // reset only the pages the instance dirtied (Linux 6.7+ PAGEMAP_SCAN;
        // elsewhere a memset of the resident part).
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES)
        .pagemap_scan(Enabled::Auto);

    let mut config = Config::new();
    config
        .epoch_interruption(true)
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
