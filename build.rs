//! Exports the allocation functions jemalloc defines (see
//! `src/allocator.rs`) from the `grpo` binary, so that the PJRT plugin it
//! loads at run time resolves `malloc` and `free` to them rather than to
//! glibc's: a plugin block must be freed by the allocator that made it.

/// The C allocation entry points jemalloc replaces.
const ALLOCATION_FUNCTIONS: [&str; 10] = [
    "malloc",
    "calloc",
    "realloc",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "malloc_usable_size",
];

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        for function in ALLOCATION_FUNCTIONS {
            println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol={function}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
