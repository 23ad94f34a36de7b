// grpo-ctrl pendulum firmware for an Arduino-class board (an Uno, or a 32-bit one).
//
// `grpo-ctrl firmware --board uno --out pendulum_board [--policy policy.onnx]`
// writes the sketch folder: this file, board_pendulum.c, board_pendulum.h,
// arduino_api.h, policy_link.h and, from firmware_bridge/firmware/: fw_core.c,
// fw_core.h, fw_hw.h, proto.c, proto.h (and with --policy policy.c, policy.h,
// the on-device controller). Build and upload with
// the Arduino IDE or
//   arduino-cli compile --fqbn arduino:avr:uno pendulum_board
// Pins, encoder resolution and the actuator calibration are at the top of
// board_pendulum.c. The host side: grpo-ctrl run --port /dev/ttyACM0 --policy policy.onnx
#include "arduino_api.h"
#include "board_pendulum.h"

extern "C" int board_serial_available(void) { return Serial.available(); }
extern "C" int board_serial_read(void) { return Serial.read(); }
extern "C" void board_serial_write(const uint8_t *bytes, size_t n) { Serial.write(bytes, n); }
extern "C" size_t board_serial_room(void) { return (size_t)Serial.availableForWrite(); }

void setup() {
  Serial.begin(1000000);  // USB CDC ignores the rate; a UART needs it (grpo-ctrl run --baud)
  board_setup();
}

void loop() { board_loop(); }
