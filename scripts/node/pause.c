/* The pod sandbox's process ("pause"): it holds the pod's namespaces open, does nothing else, reaps the
 * zombies of a pod that shares its PID namespace, and exits at once on SIGINT or SIGTERM.
 * Built static (gcc -static) by scripts/provision-node.sh, so its image needs no libc. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signum) {
  (void)signum;
  _exit(0);
}

static void reap(int signum) {
  (void)signum;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause (asyncrl)\n");
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not PID 1\n");
  }
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = stop;
  if (sigaction(SIGINT, &action, NULL) < 0 || sigaction(SIGTERM, &action, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  action.sa_handler = reap;
  action.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &action, NULL) < 0) {
    perror("pause: sigaction");
    return 2;
  }
  for (;;) {
    pause();
  }
  return 42;
}
