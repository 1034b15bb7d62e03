/* _sigrec: who sent a signal to this process, written where its death cannot erase it.
 *
 * A tiny SA_SIGINFO handler put in front of the handler already installed for each signal
 * asked for. On a signal it writes the sender as the kernel gives it (si_pid, si_uid,
 * si_code), the time, and the sender's /proc/PID/comm and /proc/PID/cmdline (read with
 * open/read) into one slot of the flight record's signal area (a MAP_SHARED mapping of the
 * flight record file, which the nanny reads after the death), then chains to the handler
 * it found: that handler's own function (CPython's trampoline for a signal.signal handler,
 * faulthandler's dump), or, where it found the default action, the default action back and
 * the signal raised again, so the process ends as it would have.
 *
 * It never blocks a signal, never touches a thread's mask and never runs at a fork or an
 * exec. Only async-signal-safe calls run in the handler (open, read, close, clock_gettime,
 * getpid, sigaction, raise). A handler installed after it (signal.signal in task code)
 * replaces it as it would any handler; stop() puts back only what it replaced itself.
 * Signals that were ignored (SIG_IGN) are left alone: an ignored signal cannot end the
 * process, and stays ignored across an exec only while it is ignored here.
 *
 * The slot layout is read by oomguard/_host/flight.py (`_SIG_SLOT`, `SIG_CMDLINE_AT`);
 * the two are checked against each other when recording starts.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#ifdef __linux__

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NAME_BYTES 64
#define CMDLINE_BYTES 4096
#define MAX_SIGNAL 64

/* One received signal. seq is 0 while the slot is empty or being written, and is written
 * last: a slot torn by a SIGKILL mid-write reads as empty. */
struct slot {
    uint64_t seq;
    int32_t signo;
    int32_t code;
    int32_t pid;
    uint32_t uid;
    int64_t sec;
    int64_t nsec;
    uint32_t name_len;
    uint32_t cmdline_len;
    char name[NAME_BYTES];
    char pad[16];
    char cmdline[CMDLINE_BYTES];
};

_Static_assert(offsetof(struct slot, name) == 48, "flight.py reads the name at 48");
_Static_assert(offsetof(struct slot, cmdline) == 128, "flight.py reads the cmdline at 128");
_Static_assert(sizeof(struct slot) == 4224, "flight.py's SIG_SLOT_SIZE");

static struct sigaction previous[MAX_SIGNAL + 1]; /* what each handler of ours replaced */
static struct sigaction ours[MAX_SIGNAL + 1];
static uint64_t started_mask;   /* signals ours was installed for */
static unsigned char *area;     /* the first slot; NULL when not recording (atomic) */
static uint32_t nslots;
static void *map_base;
static size_t map_len;
static pid_t owner;              /* a forked child's signals are not the worker's */
static uint64_t counter;         /* slots claimed so far (atomic) */
static int in_flight;            /* handlers writing into the mapping now (atomic) */

static void *handler_of(const struct sigaction *a) {
    return (a->sa_flags & SA_SIGINFO) ? (void *)a->sa_sigaction : (void *)a->sa_handler;
}

/* "/proc/<pid>/<leaf>" into out (no snprintf: not async-signal-safe). */
static void proc_path(char *out, pid_t pid, const char *leaf) {
    char digits[16];
    int n = 0;
    unsigned long v = (unsigned long)pid;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < (int)sizeof(digits));
    memcpy(out, "/proc/", 6);
    out += 6;
    while (n) *out++ = digits[--n];
    *out++ = '/';
    while (*leaf) *out++ = *leaf++;
    *out = '\0';
}

static uint32_t read_proc(pid_t pid, const char *leaf, char *out, size_t cap) {
    char path[48];
    proc_path(path, pid, leaf);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return 0;
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, out + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    return (uint32_t)n;
}

static void record(unsigned char *first, int sig, const siginfo_t *info) {
    uint64_t seq = __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST);
    struct slot *s = (struct slot *)(first + ((seq - 1) % nslots) * sizeof(struct slot));
    __atomic_store_n(&s->seq, 0, __ATOMIC_RELEASE);
    /* Sent by a process (kill, sigqueue, tgkill): si_pid and si_uid are the sender's.
     * Otherwise (the kernel, a timer) they mean nothing: recorded as 0. */
    int sent = info->si_code == SI_USER || info->si_code == SI_QUEUE || info->si_code == SI_TKILL;
    struct timespec now = {0, 0};
    clock_gettime(CLOCK_REALTIME, &now);
    s->signo = sig;
    s->code = info->si_code;
    s->pid = sent ? info->si_pid : 0;
    s->uid = sent ? info->si_uid : 0;
    s->sec = now.tv_sec;
    s->nsec = now.tv_nsec;
    s->name_len = 0;
    s->cmdline_len = 0;
    if (sent && info->si_pid > 0) {
        s->name_len = read_proc(info->si_pid, "comm", s->name, NAME_BYTES);
        s->cmdline_len = read_proc(info->si_pid, "cmdline", s->cmdline, CMDLINE_BYTES);
    }
    __atomic_store_n(&s->seq, seq, __ATOMIC_RELEASE);
}

/* The handler found when ours was installed, called as the kernel would have. */
static void chain(int sig, siginfo_t *info, void *ctx) {
    const struct sigaction *prev = &previous[sig];
    void *h = handler_of(prev);
    if (h == (void *)SIG_IGN) return;
    if (h == (void *)SIG_DFL) {
        /* The default action back, and the signal again: it is delivered as this handler
         * returns (or at once, where it is not blocked here) and ends the process. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        raise(sig);
        return;
    }
    if (prev->sa_flags & SA_SIGINFO)
        prev->sa_sigaction(sig, info, ctx);
    else
        prev->sa_handler(sig);
    /* A handler that chains by putting its own previous handler back, raising, and then
     * installing itself again (faulthandler.register(..., chain=True) does) leaves itself
     * in front of ours: put ours back in front, so the next signal is recorded too. */
    struct sigaction now;
    if (sigaction(sig, NULL, &now) == 0 && handler_of(&now) == h)
        sigaction(sig, &ours[sig], NULL);
}

static void on_signal(int sig, siginfo_t *info, void *ctx) {
    int saved = errno;
    __atomic_add_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
    unsigned char *first = __atomic_load_n(&area, __ATOMIC_SEQ_CST);
    if (first != NULL && info != NULL && getpid() == owner) record(first, sig, info);
    __atomic_sub_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
    errno = saved;
    if (sig > 0 && sig <= MAX_SIGNAL) chain(sig, info, ctx);
    errno = saved;
}

static int is_ours(int sig) {
    struct sigaction now;
    return sigaction(sig, NULL, &now) == 0 && handler_of(&now) == (void *)on_signal;
}

/* start(fd, offset, slots, signals) -> the signals now recorded (a bit mask). */
static PyObject *sigrec_start(PyObject *self, PyObject *args) {
    int fd;
    long long offset;
    unsigned int slots;
    unsigned long long wanted;
    if (!PyArg_ParseTuple(args, "iLIK", &fd, &offset, &slots, &wanted)) return NULL;
    if (area != NULL || map_base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the signal recorder is already recording");
        return NULL;
    }
    if (offset < 0 || slots == 0 || slots > 1024) {
        PyErr_SetString(PyExc_ValueError, "bad signal area offset or slot count");
        return NULL;
    }
    long page = sysconf(_SC_PAGESIZE);
    off_t base = (off_t)(offset - offset % page);
    size_t delta = (size_t)(offset - base);
    size_t len = delta + (size_t)slots * sizeof(struct slot);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, base);
    if (m == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    map_base = m;
    map_len = len;
    nslots = slots;
    owner = getpid();
    __atomic_store_n(&counter, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&area, (unsigned char *)m + delta, __ATOMIC_SEQ_CST);
    started_mask = 0;
    for (int sig = 1; sig <= MAX_SIGNAL && sig < 64; sig++) {
        if (!(wanted >> sig & 1)) continue;
        struct sigaction cur;
        if (sigaction(sig, NULL, &cur) != 0) continue;
        void *h = handler_of(&cur);
        if (h == (void *)SIG_IGN || h == (void *)on_signal) continue;
        /* The mask and flags of the handler in place, so its own code runs as before
         * (SA_RESTART, SA_NODEFER, SA_ONSTACK: faulthandler's chain relies on NODEFER). */
        memset(&ours[sig], 0, sizeof(ours[sig]));
        ours[sig].sa_sigaction = on_signal;
        ours[sig].sa_mask = cur.sa_mask;
        ours[sig].sa_flags = (cur.sa_flags & ~SA_RESETHAND) | SA_SIGINFO;
        previous[sig] = cur;
        struct sigaction old;
        if (sigaction(sig, &ours[sig], &old) != 0) continue;
        if (handler_of(&old) != h) previous[sig] = old; /* changed by another thread meanwhile */
        started_mask |= 1ULL << sig;
    }
    return PyLong_FromUnsignedLongLong(started_mask);
}

/* stop() -> the signals whose handler was put back; the others were replaced after ours
 * (by task code): what replaced it stays. Then the mapping goes, once no handler uses it. */
static PyObject *sigrec_stop(PyObject *self, PyObject *noargs) {
    uint64_t restored = 0;
    for (int sig = 1; sig <= MAX_SIGNAL && sig < 64; sig++) {
        if (!(started_mask >> sig & 1)) continue;
        struct sigaction old;
        if (sigaction(sig, &previous[sig], &old) != 0) continue;
        if (handler_of(&old) == (void *)on_signal)
            restored |= 1ULL << sig;
        else
            sigaction(sig, &old, NULL); /* not ours any more: leave it as it was */
    }
    started_mask = 0;
    __atomic_store_n(&area, NULL, __ATOMIC_SEQ_CST);
    /* A handler already past its check of `area` finishes its slot first. */
    for (int i = 0; i < 100000 && __atomic_load_n(&in_flight, __ATOMIC_SEQ_CST); i++) {
        struct timespec pause = {0, 10000};
        nanosleep(&pause, NULL);
    }
    if (map_base != NULL && __atomic_load_n(&in_flight, __ATOMIC_SEQ_CST) == 0) {
        munmap(map_base, map_len);
    }
    map_base = NULL;
    map_len = 0;
    return PyLong_FromUnsignedLongLong(restored);
}

/* recording() -> the signals for which ours is the installed handler right now. */
static PyObject *sigrec_recording(PyObject *self, PyObject *noargs) {
    uint64_t mask = 0;
    for (int sig = 1; sig <= MAX_SIGNAL && sig < 64; sig++)
        if (started_mask >> sig & 1 && is_ours(sig)) mask |= 1ULL << sig;
    return PyLong_FromUnsignedLongLong(mask);
}

static PyMethodDef methods[] = {
    {"start", sigrec_start, METH_VARARGS,
     "start(fd, offset, slots, signals): record the senders of `signals` (a bit mask) into "
     "`slots` slots at `offset` of the file `fd`; returns the signals recorded."},
    {"stop", sigrec_stop, METH_NOARGS,
     "stop(): put back the handlers replaced; returns the signals put back."},
    {"recording", sigrec_recording, METH_NOARGS,
     "recording(): the signals whose handler is the recorder right now (a bit mask)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sigrec",
    "Who sent a signal: the native recorder (see oomguard/_host/sigrec.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__sigrec(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "SLOT_SIZE", (long)sizeof(struct slot)) < 0 ||
        PyModule_AddIntConstant(m, "CMDLINE_AT", (long)offsetof(struct slot, cmdline)) < 0 ||
        PyModule_AddIntConstant(m, "CMDLINE_BYTES", CMDLINE_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#else /* not Linux: no /proc, no module (the recorder is optional) */
#error "oomguard's signal recorder is Linux-only"
#endif
