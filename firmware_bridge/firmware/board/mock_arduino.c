/*
 * A tiny stand-in for the Arduino core, so that the board back-end compiles
 * and runs on the host in tests: a settable clock, pins that remember their
 * level and PWM duty, the interrupt table, and serial buffers.
 */
#include "mock_arduino.h"

#include <string.h>

mock_board mock;

unsigned long micros(void) { return (unsigned long)(uint32_t)mock.now_us; }
void pinMode(uint8_t pin, uint8_t mode) { mock.mode[pin] = mode; }
int digitalRead(uint8_t pin) { return mock.level[pin]; }
void digitalWrite(uint8_t pin, uint8_t value) { mock.level[pin] = value; }
void analogWrite(uint8_t pin, int value) { mock.pwm[pin] = value; }
int digitalPinToInterrupt(uint8_t pin) { return pin; }
void attachInterrupt(uint8_t interrupt, void (*isr)(void), int mode)
{
  (void)mode;
  mock.isr[interrupt] = isr;
}
void noInterrupts(void) {}
void interrupts(void) {}

int board_serial_available(void) { return (int)(mock.rx_len - mock.rx_pos); }
int board_serial_read(void) { return mock.rx_pos < mock.rx_len ? mock.rx[mock.rx_pos++] : -1; }
void board_serial_write(const uint8_t *bytes, size_t n)
{
  if (mock.tx_len + n <= sizeof mock.tx) {
    memcpy(mock.tx + mock.tx_len, bytes, n);
    mock.tx_len += n;
  }
}

void mock_set_pin(uint8_t pin, int level)
{
  if (mock.level[pin] == level) return;
  mock.level[pin] = (uint8_t)level;
  if (mock.isr[pin]) mock.isr[pin]();
}

void mock_send(const uint8_t *bytes, size_t n)
{
  memcpy(mock.rx + mock.rx_len, bytes, n);
  mock.rx_len += n;
}
