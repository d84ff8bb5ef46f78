/* Two libraries built from this file (UNWIND_RELOAD_B or not), for the profiler's unit test
 * unwind_reload: the same size, and reload_call's call at the same offset, with another frame
 * there. A keeps a frame pointer; B keeps RSP's frame and RBP holding a value past the end of
 * user memory (saved on the stack first, as the CFI says): A's rule followed in B reads there.
 *
 * void reload_call(void (*fn)(void *), void *arg): calls fn(arg). */
__asm__(".text\n"
        ".globl reload_call\n"
        ".type reload_call, @function\n"
        "reload_call:\n"
        ".cfi_startproc\n"
        "  push %rbp\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_offset %rbp, -16\n"
#ifdef UNWIND_RELOAD_B
        "  movabs $0x800000000000, %rbp\n" /* 10 bytes */
#else
        "  mov %rsp, %rbp\n" /* 3 bytes */
        ".cfi_def_cfa_register %rbp\n"
        "  .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n" /* nopl 0(%rax,%rax): 5 bytes */
        "  nop\n"
        "  nop\n"
#endif
        "  mov %rdi, %rax\n"
        "  mov %rsi, %rdi\n"
        "  call *%rax\n"
        "  pop %rbp\n"
        ".cfi_def_cfa %rsp, 8\n"
        ".cfi_restore %rbp\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size reload_call, .-reload_call\n");
