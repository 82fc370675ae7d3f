/* A compiled program that lives argv[1] milliseconds (half asleep, half computing), then exits:
 * the "compiled program living 5-50 ms" of benchmarks/bench_exec_mix.py. */
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    double ms = argc > 1 ? atof(argv[1]) : 20.0;
    double start = now_ms();
    struct timespec half = {0, (long)(ms / 2 * 1e6)};
    nanosleep(&half, NULL);
    volatile unsigned long x = 0;
    while (now_ms() - start < ms)
        x += 1;
    return 0;
}
