/* host_spin: a spin lock initialized, taken, released and tried from a preinit function,
 * which runs before any library's constructor (alloclens's included), then used from main.
 * Prints what each call returned; exits 0. */
#include <pthread.h>
#include <stdio.h>

static pthread_spinlock_t early;
static int lock_early = -1, unlock_early = -1, trylock_early = -1;

static void preinit(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    pthread_spin_init(&early, PTHREAD_PROCESS_PRIVATE);
    lock_early = pthread_spin_lock(&early);
    unlock_early = pthread_spin_unlock(&early);
    trylock_early = pthread_spin_trylock(&early);
}

__attribute__((section(".preinit_array"), used)) static void (*const preinit_fn)(int, char **, char **) = preinit;

int main(void)
{
    int held = pthread_spin_trylock(&early);
    int unlock = pthread_spin_unlock(&early);
    int again = pthread_spin_trylock(&early);
    printf("preinit: lock %d unlock %d trylock %d; main: trylock while held %d, unlock %d, trylock %d\n",
           lock_early, unlock_early, trylock_early, held, unlock, again);
    return 0;
}
