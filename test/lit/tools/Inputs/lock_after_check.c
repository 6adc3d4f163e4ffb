// A race maker for tests, loaded with LD_PRELOAD: right after the run's probe of its --log
// (a shared, non-blocking flock that finds the log free), a child process opens the same file
// and takes its lock, as a second run that started at the same moment would. The child holds it
// until the run ends (a pipe whose writing end only the run keeps).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

int flock(int fd, int op) {
  int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
  const int rc = real(fd, op);
  static int done = 0;
  if (rc != 0 || done || op != (LOCK_SH | LOCK_NB)) return rc;
  done = 1;
  real(fd, LOCK_UN);  // (the probe's shared lock, which the run lets go of next anyway)
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return rc;
  path[n] = 0;
  int held[2], alive[2];
  if (pipe(held) != 0 || pipe(alive) != 0) return rc;
  if (fork() == 0) {
    close(held[0]);
    close(alive[1]);
    const int mine = open(path, O_RDONLY);
    if (mine >= 0 && real(mine, LOCK_EX | LOCK_NB) == 0) (void)!write(held[1], "x", 1);
    close(held[1]);
    char c;
    while (read(alive[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(held[1]);
  close(alive[0]);
  fcntl(alive[1], F_SETFD, FD_CLOEXEC);
  char c;
  (void)!read(held[0], &c, 1);  // the child holds the lock now
  close(held[0]);
  return rc;
}
