//! Names this crate's platform conditions once, so the source says `#[cfg(sampler)]`
//! instead of repeating what it means (in the spirit of tokio's `cfg_rt!`, but usable in
//! `cfg_attr` and `cfg!` too).

fn main() {
    // Feature `ebpf-labels`: the custom-labels symbols, in C (src/labels/ebpf.rs says
    // why), where this crate's own sampler runs (the labels' words are its).
    #[cfg(feature = "ebpf-labels")]
    {
        println!("cargo::rerun-if-changed=csrc/custom_labels.c");
        let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
        let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
        if os == "linux" && (arch == "x86_64" || arch == "aarch64") {
            cc::Build::new()
                .file("csrc/custom_labels.c")
                .warnings(true)
                .compile("krabka_custom_labels");
        }
    }
    cfg_aliases::cfg_aliases! {
        // This crate's own CPU sampler (per-thread timers, framehop): Linux on x86_64 and
        // aarch64.
        sampler: {
            all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))
        },
        // The `pprof` crate's CPU sampler: every other Unix system, and Linux with the
        // hidden feature the tests build it with.
        pprof_rs: {
            any(all(unix, not(sampler)), all(sampler, feature = "__pprof-rs-sampler"))
        },
        // `/proc/self` facts: threads, their states, CPU clocks, signal masks, seccomp modes
        // (process.rs).
        procfs: { target_os = "linux" },
        // Symbolization from ELF symbol tables and DWARF of the loaded objects
        // (symbolize/): the objects are listed from the dynamic loader, as on Linux.
        elf: { target_os = "linux" },
        // `krabka_pprof::Jemalloc`, the allocator users install (feature `heap-profiling`;
        // tikv-jemallocator does not build for MSVC).
        jemalloc: { all(feature = "heap-profiling", not(target_env = "msvc")) },
        // jemalloc heap dumps: Linux with glibc (musl's jemalloc would walk stacks by frame
        // pointers and crash), with the `heap-profiling` feature.
        heap_dumps: {
            all(feature = "heap-profiling", target_os = "linux", not(target_env = "musl"))
        },
        // tokio's task dump: the `task-dump` feature, tokio's own opt-in
        // (RUSTFLAGS="--cfg tokio_unstable"), and the targets tokio's `taskdump` builds on
        // (elsewhere, with the flag, tokio stops the build with its own compile_error!).
        task_dumps: {
            all(
                feature = "task-dump",
                tokio_unstable,
                target_os = "linux",
                any(
                    target_arch = "x86_64",
                    target_arch = "aarch64",
                    target_arch = "x86",
                    target_arch = "s390x"
                )
            )
        },
    }
}
