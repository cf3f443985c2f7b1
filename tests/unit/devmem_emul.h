/*
 * devmem_emul.h: the memory of the emulated GPU, for the host emulations
 * of the CUDA code (kv_cuda_emul.c: kv_cuda.h; cuda_runtime_emul.c: the
 * CUDA runtime and cuBLAS; backend_cuda_emul.c: backend_cuda.cu's
 * kernels). Tests only. One device, one memory: cuda_alloc() and
 * cudaMalloc() hand out the same kind of pointer, as on a GPU, so the
 * model can give the backend's activation buffers to the KV cache.
 *
 * Device memory is recognisably not host memory:
 *   - it comes from one reserved address range that host allocations
 *     never share, each allocation on its own pages followed by a guard
 *     page, and addresses are never reused after a free;
 *   - it is PROT_NONE except while an emulated call runs
 *     (devmem_open() .. devmem_close()), so host code that reads or
 *     writes through a device pointer faults (SIGSEGV, after a message
 *     naming the address as device memory);
 *   - the emulated calls check each pointer they are given:
 *     devmem_check() aborts unless a range lies inside one live
 *     allocation, devmem_check_host() aborts if a range meant to be host
 *     memory touches the device range;
 *   - new allocations are filled with 0xff bytes (NaN as floats and
 *     halves), as cudaMalloc does not zero them.
 *
 * TKV_CUDA_EMUL_MEM_LIMIT=<bytes> caps the bytes live at once (read at
 * each allocation), so out-of-memory paths can be tested. Device memory
 * still allocated at exit is reported and the exit status made 1.
 * Not thread-safe: the emulated device is driven from one thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* bytes (at least 1) of device memory, 0xff-filled; NULL when the cap or the range is exhausted. */
void *devmem_alloc(size_t bytes);

/* Release an allocation; NULL is ignored, anything else not live aborts (what: the caller). */
void devmem_free(void *p, const char *what);

/* Whether p is the start of a live allocation. */
bool devmem_is_allocation(const void *p);

/* Whether p lies in the device address range (live, freed or guard). */
bool devmem_in_range(const void *p);

/* Abort with a message naming what unless [p, p + bytes) lies inside one live allocation. */
void devmem_check(const void *p, size_t bytes, const char *what);

/* Abort with a message naming what if [p, p + bytes), host memory by contract, touches device memory. */
void devmem_check_host(const void *p, size_t bytes, const char *what);

/* Print "cuda emulation: " and the message on stderr, then abort: an emulated GPU fault. */
_Noreturn void devmem_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Make every live allocation readable and writable until the matching devmem_close(); nests. */
void devmem_open(void);
void devmem_close(void);
