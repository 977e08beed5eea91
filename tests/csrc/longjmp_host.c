/* A host's C timeout idiom: a SIGALRM handler that leaves by siglongjmp, cutting short
 * whatever its thread was doing, as C libraries and services with a "time-boxed
 * section" do. test_child's `child-jumper` spins under a timer sending it SIGALRM every
 * 20 µs (a high-resolution timer: not held to the kernel's tick, as CPU timers are, so
 * alarms land at any point of the profiler's own SIGPROF handler on that thread, dozens
 * of times a second at 1000 Hz): one that nested there would leave the profiler's
 * handler half done. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __thread sigjmp_buf env;
static __thread volatile sig_atomic_t armed;
static volatile uint64_t jumps;

static void on_alarm(int signal) {
    (void)signal;
    if (armed) {
        armed = 0;
        jumps++;
        siglongjmp(env, 1);
    }
}

/* Installs the handler (nothing blocked while it runs, no SA_RESTART), and a timer
 * that sends the calling thread SIGALRM every `every_ns`. 0 on success. */
int krabka_longjmp_install(long every_ns) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_alarm;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGALRM, &action, NULL) != 0) {
        return -1;
    }
    struct sigevent event;
    memset(&event, 0, sizeof event);
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = SIGALRM;
#ifdef __GLIBC__
    /* glibc before 2.35 names the field only so. */
    event._sigev_un._tid = (pid_t)syscall(SYS_gettid);
#else
    event.sigev_notify_thread_id = (pid_t)syscall(SYS_gettid);
#endif
    timer_t timer;
    if (timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) {
        return -1;
    }
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    spec.it_interval.tv_nsec = every_ns;
    spec.it_value.tv_nsec = every_ns;
    return timer_settime(timer, 0, &spec, NULL);
}

/* Spins until an alarm cuts the spin short by siglongjmp, `rounds` times. */
uint64_t krabka_longjmp_spin(uint64_t rounds) {
    volatile uint64_t x = 1;
    for (uint64_t round = 0; round < rounds; round++) {
        if (sigsetjmp(env, 1) == 0) {
            armed = 1;
            for (;;) {
                x = x * 6364136223846793005ull + round;
            }
        }
    }
    return x;
}

/* How many times an alarm left by siglongjmp. */
uint64_t krabka_longjmp_count(void) {
    return jumps;
}
