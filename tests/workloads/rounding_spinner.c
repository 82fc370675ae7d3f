/* rounding_spinner.c - one thread that never sleeps, setting the SSE rounding mode from two
 * random bits every 256 steps, as RandomX's CFROUND does: the FPU probe's look-alike of a
 * RandomX worker without the rest of a miner (no memory, no session).  Prints "ready", then
 * runs until killed.
 */
#include <stdint.h>
#include <stdio.h>
#include <xmmintrin.h>

int main(void)
{
    uint64_t x = 88172645463325252ULL;
    unsigned csr = _mm_getcsr();
    volatile double f = 1.1;
    printf("ready\n");
    fflush(stdout);
    for (uint64_t s = 0;; s++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        f = f * 1.0000001 + 1e-9;
        if ((s & 255) == 0)
            _mm_setcsr((csr & ~0x6000u) | (unsigned)((x & 3) << 13));
    }
}
