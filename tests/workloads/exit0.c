/* exit0.c - the smallest program: _exit(0) by a raw syscall, no libc (x86-64, aarch64). */
void _start(void)
{
#if defined(__x86_64__)
    __asm__ volatile("mov $60, %eax\n\txor %edi, %edi\n\tsyscall");
#elif defined(__aarch64__)
    __asm__ volatile("mov x8, #93\n\tmov x0, #0\n\tsvc #0");
#else
#error "exit0.c: x86-64 or aarch64 only"
#endif
    for (;;) {
    }
}
