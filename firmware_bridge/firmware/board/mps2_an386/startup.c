/* Reset and the vector table for a Cortex-M4F: copy .data, zero .bss,
 * turn on the FPU, call main. SysTick and UART0 RX (IRQ 0) handlers are
 * the firmware's where it defines them; any fault stops in a loop the
 * debugger can see. */
#include <stdint.h>

extern uint32_t _stack_top, _data_load, _data_start, _data_end, _bss_start, _bss_end;
int main(void);
void reset_handler(void);

void fault_handler(void);
void systick_handler(void) __attribute__((weak, alias("fault_handler")));
void uart0_rx_handler(void) __attribute__((weak, alias("fault_handler")));

void fault_handler(void)
{
  for (;;) {
  }
}

__attribute__((section(".vectors"), used)) static void (*const VECTORS[17])(void) = {
    (void (*)(void))(uintptr_t)&_stack_top, reset_handler, fault_handler, fault_handler,
    fault_handler, fault_handler, fault_handler, 0, 0, 0, 0, fault_handler, fault_handler, 0,
    fault_handler, systick_handler, uart0_rx_handler};

void reset_handler(void)
{
  const uint32_t *src = &_data_load;
  for (uint32_t *dst = &_data_start; dst < &_data_end;) *dst++ = *src++;
  for (uint32_t *dst = &_bss_start; dst < &_bss_end;) *dst++ = 0;
  *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20;  /* CPACR: CP10 and CP11, the FPU */
  __asm__ __volatile__("dsb\n\tisb" ::: "memory");
  main();
  for (;;) {
  }
}
