/* The two symbols of Polar Signals' custom-labels ABI v1 (custom-labels-v1.md), which the
 * OpenTelemetry eBPF profiler and parca-agent read: krabka-pprof's feature `ebpf-labels`
 * (src/labels/ebpf.rs writes the pointer). In C because Rust cannot give a thread-local
 * a symbol of its own. The executable must export both (`--export-dynamic-symbol`; the
 * guide's labels page): a profiler finds them in its dynamic symbol table. */
#include <stdint.h>
#include <stddef.h>

__attribute__((visibility("default"), used)) const uint32_t custom_labels_abi_version = 1;

/* The thread's active label set (a custom_labels_labelset_t), or null. In the
 * executable, at a fixed offset from the thread pointer, as the ABI requires. */
__attribute__((visibility("default"), used)) __thread void *custom_labels_current_set = NULL;

void **krabka_custom_labels_current_set(void) { return &custom_labels_current_set; }

uint32_t krabka_custom_labels_abi_version(void) { return custom_labels_abi_version; }
