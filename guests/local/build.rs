//! Links the component with heap room in its initial memory.
//!
//! wasm-ld sizes a module's initial memory to its stack and data, so every
//! allocation a request makes grows the memory, and wasmtime makes each
//! growth accessible with an `mprotect` (then takes it back when the slot is
//! reused): three or four per POST, each a TLB shootdown across the
//! server's threads. wasi-libc's allocator takes the room between the data
//! and the end of the initial memory first, so with room for a request's
//! allocations the memory never grows, and a slot reused by this guest keeps
//! its protection as it was.

fn main() {
    // Only for the wasm build: the native unit tests link with the host's
    // linker, which knows no such flag.
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg-cdylib=--initial-memory={}", 2 << 20);
    }
}
