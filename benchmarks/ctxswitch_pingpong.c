/* ctxswitch_pingpong.c - context switches as fast as two processes can make them.
 *
 *     ctxswitch_pingpong ROUNDS [ROUNDING]
 *
 * Parent and child, pinned to one CPU, pass a byte back and forth over two pipes: every
 * round trip is two context switches.  With ROUNDING=1 both leave round-toward-zero in
 * MXCSR (what the FPU probe keeps an entry for).  Prints nanoseconds per round trip.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 100000;
    int rounding = argc > 2 ? atoi(argv[2]) : 0;
    int ab[2], ba[2];
    char c = 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof(one), &one);
    if (rounding)
        _mm_setcsr(_mm_getcsr() | 0x6000);
    if (pipe(ab) || pipe(ba))
        return 1;
    pid_t child = fork();
    if (child == 0) {
        for (long i = 0; i < rounds; i++)
            if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
                _exit(1);
        _exit(0);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < rounds; i++)
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
            return 1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    waitpid(child, NULL, 0);
    printf("%.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / rounds);
    return 0;
}
