/* The exec family: an image about to be replaced writes its report first (the new image,
 * preloaded again through the environment, writes its own at exit; where LD_PRELOAD cannot
 * reach it, a line says it will not). If the exec fails, the early report is withdrawn and
 * this image goes on as before. errno is kept as exec left it. posix_spawn execs in a child
 * inside the C library, so only its line is ours to give. */
#include <dlfcn.h>
#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <unistd.h>

#include "interpose.h"

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
                        char *const[], char *const[]);

/* Resolved at start-up: a vfork child calling exec must not need the dynamic loader. */
static struct {
    execve_fn execve, execvpe;
    execv_fn execv, execvp;
    fexecve_fn fexecve;
    spawn_fn posix_spawn, posix_spawnp;
} next;

void _al_exec_resolve(void)
{
    AL_NEXT(next.execve, "execve");
    AL_NEXT(next.execvpe, "execvpe");
    AL_NEXT(next.execv, "execv");
    AL_NEXT(next.execvp, "execvp");
    AL_NEXT(next.fexecve, "fexecve");
    AL_NEXT(next.posix_spawn, "posix_spawn");
    AL_NEXT(next.posix_spawnp, "posix_spawnp");
}

const void *_al_exec_real_posix_spawn(void)
{
    return (const void *)next.posix_spawn;
}

static int failed(int rc)
{
    int saved = errno;
    _al_process_exec_failed();
    errno = saved;
    return rc;
}

AL_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    if (AL_UNLIKELY(!next.execve)) {
        errno = ENOSYS;
        return -1;
    }
    _al_process_before_exec(path, false, envp);
    return failed(next.execve(path, argv, envp));
}

AL_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    if (AL_UNLIKELY(!next.execvpe)) {
        errno = ENOSYS;
        return -1;
    }
    _al_process_before_exec(file, true, envp);
    return failed(next.execvpe(file, argv, envp));
}

AL_EXPORT int execv(const char *path, char *const argv[])
{
    if (AL_UNLIKELY(!next.execv)) {
        errno = ENOSYS;
        return -1;
    }
    _al_process_before_exec(path, false, environ);
    return failed(next.execv(path, argv));
}

AL_EXPORT int execvp(const char *file, char *const argv[])
{
    if (AL_UNLIKELY(!next.execvp)) {
        errno = ENOSYS;
        return -1;
    }
    _al_process_before_exec(file, true, environ);
    return failed(next.execvp(file, argv));
}

AL_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    if (AL_UNLIKELY(!next.fexecve)) {
        errno = ENOSYS;
        return -1;
    }
    _al_process_before_exec(NULL, false, envp);
    return failed(next.fexecve(fd, argv, envp));
}

AL_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    if (AL_UNLIKELY(!next.posix_spawn))
        return ENOSYS;
    _al_process_say_unreachable(path, false, envp);
    return next.posix_spawn(pid, path, actions, attr, argv, envp);
}

AL_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    if (AL_UNLIKELY(!next.posix_spawnp))
        return ENOSYS;
    _al_process_say_unreachable(file, true, envp);
    return next.posix_spawnp(pid, file, actions, attr, argv, envp);
}

/* The list forms: gather the arguments into an array on the stack (no allocation) and take
 * the array path. `envp_out` receives execle's environment, which follows the NULL. */
#define COLLECT_ARGS(arg0, argv, with_env, envp_out)                                  \
    size_t argc_ = 1;                                                       \
    {                                                                       \
        va_list ap_;                                                        \
        va_start(ap_, arg0);                                                \
        while (va_arg(ap_, char *))                                         \
            argc_++;                                                        \
        va_end(ap_);                                                        \
    }                                                                       \
    char *argv[argc_ + 1];                                                  \
    {                                                                       \
        va_list ap_;                                                        \
        va_start(ap_, arg0);                                                \
        argv[0] = (char *)arg0;                                             \
        for (size_t i_ = 1; i_ <= argc_; i_++)                              \
            argv[i_] = va_arg(ap_, char *);                                 \
        if (with_env)                                                       \
            envp_out = va_arg(ap_, char **);                                \
        va_end(ap_);                                                        \
    }

AL_EXPORT int execl(const char *path, const char *arg, ...)
{
    char **unused = NULL;
    COLLECT_ARGS(arg, argv, 0, unused);
    (void)unused;
    return execv(path, argv);
}

AL_EXPORT int execlp(const char *file, const char *arg, ...)
{
    char **unused = NULL;
    COLLECT_ARGS(arg, argv, 0, unused);
    (void)unused;
    return execvp(file, argv);
}

AL_EXPORT int execle(const char *path, const char *arg, ...)
{
    char **envp = NULL;
    COLLECT_ARGS(arg, argv, 1, envp);
    return execve(path, argv, envp);
}
