/* exec_flood.c - vfork+execve a program at a steady rate, for flood tests and benchmarks.
 *
 *   exec_flood RATE SECONDS [PROGRAM]
 *
 * RATE execs per second (0: as fast as it can), for SECONDS (0: until killed).
 * Each child execs PROGRAM (default /bin/true; tests/workloads/exit0.c, built static
 * without libc, is the cheapest) with an empty environment.  vfork() copies no page
 * tables, so one flooder costs little more than the exec itself.  Children are reaped
 * as they exit, at most MAX_INFLIGHT at once, so the flood leaves no zombies.
 * Prints the number of execs done on stdout and the achieved rate on stderr on exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_INFLIGHT 16

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
    char *child_argv[] = {program, NULL};
    char *child_env[] = {NULL};
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    volatile int exec_failed = 0; /* shared with the vfork child until it execs */
    double start = now();
    long done = 0, failed = 0, inflight = 0;
    while (!stopping) {
        double t = now() - start;
        if (seconds > 0 && t >= seconds)
            break;
        if (rate > 0 && done >= rate * t) {
            double ahead = done / rate - t;
            struct timespec ts = {0, (long)(ahead * 1e9)};
            nanosleep(&ts, NULL);
        } else {
            exec_failed = 0;
            pid_t pid = vfork();
            if (pid == 0) {
                execve(program, child_argv, child_env);
                exec_failed = 1;
                _exit(127);
            }
            if (pid > 0) {
                inflight++;
                if (exec_failed)
                    failed++;
                else
                    done++;
            }
        }
        /* reap what exited; block only when too many are still running */
        for (;;) {
            pid_t r = waitpid(-1, NULL, inflight >= MAX_INFLIGHT ? 0 : WNOHANG);
            if (r > 0) {
                inflight--;
                continue;
            }
            if (r < 0 && errno == EINTR && !stopping)
                continue;
            break;
        }
    }
    while (inflight > 0 && waitpid(-1, NULL, 0) > 0)
        inflight--;
    double took = now() - start;
    printf("%ld\n", done);
    fprintf(stderr, "exec_flood: %ld execs in %.2f s (%.0f/s), %ld failed\n", done, took,
            took > 0 ? done / took : 0.0, failed);
    return failed && !done ? 1 : 0;
}
