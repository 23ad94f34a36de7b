/* The reference board back-end (board_pendulum.c): call board_setup() once
 * and board_loop() as often as possible. */
#ifndef GRPO_BOARD_PENDULUM_H
#define GRPO_BOARD_PENDULUM_H

#ifdef __cplusplus
extern "C" {
#endif
void board_setup(void);
void board_loop(void);
void board_encoder_isr(void);
#ifdef __cplusplus
}
#endif
#endif
