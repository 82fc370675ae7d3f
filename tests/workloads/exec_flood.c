/* exec_flood.c - fork+exec /bin/true at a steady rate, for flood tests and benchmarks.
 *
 *   exec_flood RATE SECONDS [PROGRAM]
 *
 * RATE execs per second (0: as fast as it can), for SECONDS (0: until killed).
 * Each child execs PROGRAM (default /bin/true) and is reaped at once, so the
 * flood leaves no zombies.  Prints the number of execs done on exit.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;

static void on_signal(int sig) { (void)sig; stopping = 1; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: exec_flood RATE SECONDS [PROGRAM]\n");
        return 2;
    }
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    char *program = argc > 3 ? argv[3] : "/bin/true";
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    double start = now();
    long done = 0;
    while (!stopping) {
        double t = now() - start;
        if (seconds > 0 && t >= seconds)
            break;
        if (rate > 0 && done >= rate * t) {
            double ahead = done / rate - t;
            struct timespec ts = {0, (long)(ahead * 1e9)};
            nanosleep(&ts, NULL);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            execl(program, program, (char *)NULL);
            _exit(127);
        }
        if (pid > 0) {
            waitpid(pid, NULL, 0);
            done++;
        }
    }
    printf("%ld\n", done);
    return 0;
}
