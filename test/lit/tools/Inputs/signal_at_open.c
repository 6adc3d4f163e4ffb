// A fault injector for tests, loaded with LD_PRELOAD: the process sends itself SIGTERM (once) as
// it first opens a file whose name ends in $KILN_TEST_SIGNAL_AT_OPEN (a data shard read at
// start-up: the window before the first step, which no outside timing can hit reliably).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void maybe_signal(const char* path) {
  static int sent;
  if (sent) return;
  const char* suffix = getenv("KILN_TEST_SIGNAL_AT_OPEN");
  const size_t n = suffix ? strlen(suffix) : 0, m = strlen(path);
  if (n > 0 && m >= n && strcmp(path + m - n, suffix) == 0) sent = 1, raise(SIGTERM);
}

#define OPEN_HOOK(name, ...)                                                          \
  int name(__VA_ARGS__, int flags, ...) {                                             \
    mode_t mode = 0;                                                                  \
    if (flags & (O_CREAT | O_TMPFILE)) {                                              \
      va_list ap;                                                                     \
      va_start(ap, flags);                                                            \
      mode = va_arg(ap, mode_t);                                                      \
      va_end(ap);                                                                     \
    }                                                                                 \
    maybe_signal(path);                                                               \
    return ((int (*)(__VA_ARGS__, int, ...))dlsym(RTLD_NEXT, #name))(ARGS, flags, mode); \
  }
#define ARGS path
OPEN_HOOK(open, const char* path)
OPEN_HOOK(open64, const char* path)
#undef ARGS
#define ARGS dirfd, path
OPEN_HOOK(openat, int dirfd, const char* path)
OPEN_HOOK(openat64, int dirfd, const char* path)
