/*
 * The Arduino calls the board back-end uses. In an Arduino build (ARDUINO is
 * defined) they come from <Arduino.h>, which the Arduino tools add to .ino
 * files but not to .c files; on the host, from mock_arduino.c. The serial
 * three come from the sketch (pendulum_board.ino wraps Serial) or the mock.
 *
 * Also two things the Arduino API lacks:
 *   - board_irq_save / board_irq_restore: disable interrupts and put back
 *     the previous state (noInterrupts/interrupts would enable them even
 *     where the caller ran with them off);
 *   - portInputRegister / digitalPinToPort / digitalPinToBitMask (from the
 *     core on a board, from the mock on the host): read several pins of one
 *     port in one load, at one instant.
 */
#ifndef GRPO_ARDUINO_API_H
#define GRPO_ARDUINO_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef ARDUINO
#include <Arduino.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__AVR__)
typedef uint8_t board_port_bits;   /* an AVR port is 8 bits wide */
#else
typedef uint32_t board_port_bits;  /* 32-bit ports (Teensy, Due, STM32); the mock */
#endif

#ifndef ARDUINO
#define INPUT 0x0
#define OUTPUT 0x1
#define INPUT_PULLUP 0x2
#define LOW 0x0
#define HIGH 0x1
#define CHANGE 1
unsigned long micros(void);
void pinMode(uint8_t pin, uint8_t mode);
int digitalRead(uint8_t pin);
void digitalWrite(uint8_t pin, uint8_t value);
void analogWrite(uint8_t pin, int value);
int digitalPinToInterrupt(uint8_t pin);
void attachInterrupt(uint8_t interrupt, void (*isr)(void), int mode);
uint8_t digitalPinToPort(uint8_t pin);
board_port_bits digitalPinToBitMask(uint8_t pin);
volatile board_port_bits *portInputRegister(uint8_t port);
#endif

#if defined(__AVR__)
typedef uint8_t board_irq_state;
static inline board_irq_state board_irq_save(void)
{
  const uint8_t sreg = SREG;
  __asm__ __volatile__("cli" ::: "memory");
  return sreg;
}
static inline void board_irq_restore(board_irq_state sreg)
{
  __asm__ __volatile__("" ::: "memory");
  SREG = sreg;
}
#elif defined(__arm__)
typedef uint32_t board_irq_state;
static inline board_irq_state board_irq_save(void)
{
  uint32_t primask;
  __asm__ __volatile__("mrs %0, primask\n\tcpsid i" : "=r"(primask)::"memory");
  return primask;
}
static inline void board_irq_restore(board_irq_state primask)
{
  __asm__ __volatile__("msr primask, %0" ::"r"(primask) : "memory");
}
#else
typedef int board_irq_state;
board_irq_state board_irq_save(void);
void board_irq_restore(board_irq_state state);
#endif

/* serial, provided by the sketch over Serial (or by the mock) */
int board_serial_available(void);
int board_serial_read(void);
void board_serial_write(const uint8_t *bytes, size_t n);
size_t board_serial_room(void);  /* bytes board_serial_write takes without blocking */

#ifdef __cplusplus
}
#endif
#endif /* GRPO_ARDUINO_API_H */
