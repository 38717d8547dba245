/* The native stack of a fatal signal, printed to stderr for crash tests on hosts without gdb (built and loaded
   by tests/_native_backtrace.py): frames as object + offset for addr2line, names mangled for c++filt; then the
   handler it replaced runs (faulthandler's Python stack) and the signal's default action ends the process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_FRAMES 128
#define ALT_STACK_SIZE (256 * 1024) /* the unwinder needs more than SIGSTKSZ */

static const int SIGNALS[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE};
#define NSIG_HANDLED (sizeof(SIGNALS) / sizeof(SIGNALS[0]))
static struct sigaction previous[NSIG_HANDLED];
static volatile sig_atomic_t entered;

/* ----- async-signal-safe output: write(2) only, no stdio, no malloc */
static void put(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void put_hex(uintptr_t v) {
    char buf[2 + 2 * sizeof(v) + 1], *p = buf + sizeof(buf) - 1;
    *p = '\0';
    do {
        *--p = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    *--p = 'x';
    *--p = '0';
    put(p);
}

static void put_dec(long v) {
    char buf[24], *p = buf + sizeof(buf) - 1;
    int neg = v < 0;
    unsigned long u = neg ? -(unsigned long)v : (unsigned long)v;
    *p = '\0';
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (neg) *--p = '-';
    put(p);
}

static const char *signal_name(int sig) {
    switch (sig) {
        case SIGSEGV: return "SIGSEGV";
        case SIGBUS: return "SIGBUS";
        case SIGABRT: return "SIGABRT";
        case SIGILL: return "SIGILL";
        case SIGFPE: return "SIGFPE";
        default: return "signal";
    }
}

/* "OBJECT +0xOFFSET (SYMBOL+0xOFF)" for one code address */
static void put_location(void *addr) {
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname) {
        put("?");
        return;
    }
    put(info.dli_fname[0] ? info.dli_fname : "(main executable)");
    put(" +");
    put_hex((uintptr_t)addr - (uintptr_t)info.dli_fbase);
    if (info.dli_sname) {
        put(" (");
        put(info.dli_sname);
        put("+");
        put_hex((uintptr_t)addr - (uintptr_t)info.dli_saddr);
        put(")");
    }
}

static uintptr_t faulting_pc(void *context) {
    ucontext_t *uc = (ucontext_t *)context;
    if (!uc) return 0;
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
    return 0;
#endif
}

static void handler(int sig, siginfo_t *info, void *context) {
    size_t k;
    for (k = 0; k < NSIG_HANDLED && SIGNALS[k] != sig; k++) {
    }
    if (entered || k == NSIG_HANDLED) { /* a second fault (in here or in the chained handler): just die */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    entered = 1;

    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    put("\nnative backtrace: ");
    put(signal_name(sig));
    put(" (");
    put_dec(sig);
    put(") code ");
    put_dec(info ? info->si_code : 0);
    put(" addr ");
    put_hex(info ? (uintptr_t)info->si_addr : 0);
    put(", pid ");
    put_dec((long)getpid());
    uintptr_t pc = faulting_pc(context);
    if (pc) {
        put("\npc ");
        put_hex(pc);
        put(" ");
        put_location((void *)pc);
    }
    put("\nframes (return addresses: addr2line -f -C -e OBJECT <offset - 1>):\n");
    for (int i = 0; i < n; i++) {
        put("#");
        put_dec(i);
        put(" ");
        put_hex((uintptr_t)frames[i]);
        put(" ");
        put_location(frames[i]);
        put("\n");
    }
    put("backtrace_symbols:\n");
    backtrace_symbols_fd(frames, n, 2);
    put("native backtrace end\n");

    /* the replaced handler (faulthandler: the Python stack); if it returns, the default action */
    struct sigaction *prev = &previous[k];
    if (prev->sa_flags & SA_SIGINFO) {
        if (prev->sa_sigaction) prev->sa_sigaction(sig, info, context);
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
    }
    signal(sig, SIG_DFL);
    raise(sig); /* blocked while in here: delivered on return, or at the faulting instruction's retry */
}

/* 0 on success; may be called again (after other libraries install handlers) to be first again. */
int aura_native_backtrace_install(void) {
    static void *alt_stack;
    void *warm[1];
    backtrace(warm, 1); /* its first call loads libgcc_s (malloc, dlopen): not inside the handler */

    if (!alt_stack) {
        alt_stack = mmap(NULL, ALT_STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (alt_stack == MAP_FAILED) {
            alt_stack = NULL;
            return -1;
        }
    }
    stack_t ss; /* per thread: this covers the calling thread's stack overflows */
    memset(&ss, 0, sizeof(ss));
    ss.ss_sp = alt_stack;
    ss.ss_size = ALT_STACK_SIZE;
    if (sigaltstack(&ss, NULL) != 0) return -2;

    for (size_t k = 0; k < NSIG_HANDLED; k++) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGNALS[k], &sa, &old) != 0) return -3;
        if (!((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == handler)) previous[k] = old;
    }
    return 0;
}

__attribute__((constructor)) static void install_at_load(void) { aura_native_backtrace_install(); }
