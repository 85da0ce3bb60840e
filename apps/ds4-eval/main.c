/*
 * main.c - ds4-eval (eval.h; the program is eval_main, in app.c).
 */
#include "eval.h"

int main(int argc, char **argv) { return eval_main(argc, argv, NULL); }
