/*
 * main.c - ds4-agent, the coding agent (docs/AGENT.md).
 */
#include "app.h"

int main(int argc, char **argv) { return agent_app_main(argc, argv, NULL); }
