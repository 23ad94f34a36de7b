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
uint8_t digitalPinToPort(uint8_t pin) { return (uint8_t)(pin / 32); }
board_port_bits digitalPinToBitMask(uint8_t pin) { return (board_port_bits)1u << (pin % 32); }
volatile board_port_bits *portInputRegister(uint8_t port) { return &mock.port_in[port]; }

board_irq_state board_irq_save(void)
{
  const board_irq_state was = mock.irq_enabled;
  mock.irq_enabled = 0;
  mock.irq_disables++;
  return was;
}
void board_irq_restore(board_irq_state state) { mock.irq_enabled = state; }

int board_serial_available(void) { return (int)(mock.rx_len - mock.rx_pos); }
int board_serial_read(void) { return mock.rx_pos < mock.rx_len ? mock.rx[mock.rx_pos++] : -1; }
size_t board_serial_room(void) { return mock.tx_room; }
void board_serial_write(const uint8_t *bytes, size_t n)
{
  if (n > mock.tx_max_write) mock.tx_max_write = n;
  if (mock.tx_len + n <= sizeof mock.tx) {
    memcpy(mock.tx + mock.tx_len, bytes, n);
    mock.tx_len += n;
  }
}

void mock_set_pin(uint8_t pin, int level)
{
  if (mock.level[pin] == level) return;
  mock.level[pin] = (uint8_t)level;
  const board_port_bits bit = digitalPinToBitMask(pin);
  volatile board_port_bits *port = &mock.port_in[digitalPinToPort(pin)];
  *port = level ? *port | bit : *port & ~bit;
  if (mock.isr[pin]) mock.isr[pin]();
}

void mock_send(const uint8_t *bytes, size_t n)
{
  memcpy(mock.rx + mock.rx_len, bytes, n);
  mock.rx_len += n;
}
