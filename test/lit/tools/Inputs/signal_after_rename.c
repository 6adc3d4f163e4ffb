// A fault injector for tests, loaded with LD_PRELOAD: the process sends itself SIGTERM right
// after a rename onto a name that ends in $KILN_TEST_SIGNAL_AFTER_RENAME, the moment a
// checkpoint lands, which no outside timing can hit reliably.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

int rename(const char* from, const char* to) {
  int (*real)(const char*, const char*) = (int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename");
  const int rc = real(from, to);
  const char* suffix = getenv("KILN_TEST_SIGNAL_AFTER_RENAME");
  const size_t n = suffix ? strlen(suffix) : 0, m = strlen(to);
  if (rc == 0 && n > 0 && m >= n && strcmp(to + m - n, suffix) == 0) raise(SIGTERM);
  return rc;
}
