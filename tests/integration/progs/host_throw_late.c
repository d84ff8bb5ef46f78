/* host_throw_late: a C program, so the C++ runtime (and the unwinder with it) is not loaded
 * when alloclens starts: it comes with libhost_throw_plugin.so (host_throw.cpp built as a
 * library), loaded here with dlopen, RTLD_LOCAL. host_throw_run() then makes operator new throw
 * std::bad_alloc through alloclens's wrappers and prints its truth line, as host_throw does.
 *
 * usage: host_throw_late PLUGIN.so */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: host_throw_late PLUGIN.so\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "host_throw_late: %s\n", dlerror());
        return 1;
    }
    int (*run)(void) = (int (*)(void))dlsym(h, "host_throw_run");
    if (!run) {
        fprintf(stderr, "host_throw_late: %s\n", dlerror());
        return 1;
    }
    return run();
}
