/*
 * The few Arduino calls the board back-end uses, declared for C. On a board
 * they come from the Arduino core (and the serial three from the sketch,
 * pendulum_board.ino, which wraps Serial); on the host, from mock_arduino.c.
 */
#ifndef GRPO_ARDUINO_API_H
#define GRPO_ARDUINO_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
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
void noInterrupts(void);
void interrupts(void);
#endif

/* serial, provided by the sketch over Serial (or by the mock) */
int board_serial_available(void);
int board_serial_read(void);
void board_serial_write(const uint8_t *bytes, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* GRPO_ARDUINO_API_H */
