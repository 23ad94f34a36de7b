/* The host-side mock of the Arduino core (mock_arduino.c). */
#ifndef GRPO_MOCK_ARDUINO_H
#define GRPO_MOCK_ARDUINO_H

#include "arduino_api.h"

typedef struct {
  uint64_t now_us;
  uint8_t mode[64], level[64];
  int pwm[64];
  volatile board_port_bits port_in[2];  /* input registers of pins 0-31, 32-63 */
  void (*isr[64])(void);
  int irq_enabled;                       /* the interrupt enable flag */
  unsigned irq_disables;                 /* times board_irq_save ran */
  uint8_t rx[4096], tx[65536];
  size_t rx_len, rx_pos, tx_len;
  size_t tx_room;                        /* what Serial.availableForWrite() says */
  size_t tx_max_write;                   /* the most bytes one write passed */
} mock_board;

extern mock_board mock;
/* Drive an input pin, running its interrupt handler on a change. */
void mock_set_pin(uint8_t pin, int level);
/* Bytes from the host. */
void mock_send(const uint8_t *bytes, size_t n);

#endif
