// sh.c: the shell, the one user program. It reads a line, splits it into
// words at spaces, and runs the command the first word names. There are
// no pipes, no quoting, no variables and no ';'.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "user/user.h"

#define MAXLINE 128
#define MAXARGS 16

static char line[MAXLINE];

// getline reads a line into buf, echoing what is typed: backspace (BS
// or DEL) erases, and CR or LF ends the line (LF right after CR is the
// same end). It returns the line's length, without the newline.
static int getline(char *buf, int max)
{
	static int lastcr;
	int n = 0;
	char c;

	for (;;) {
		if (read(0, &c, 1) != 1)
			continue;
		if (c == '\n' && lastcr) {
			lastcr = 0;
			continue;
		}
		lastcr = c == '\r';
		if (c == '\r' || c == '\n') {
			print("\n");
			buf[n] = '\0';
			return n;
		}
		if (c == '\b' || c == 0x7f) {
			if (n > 0) {
				n--;
				print("\b \b");
			}
		} else if (c >= ' ' && c < 0x7f && n < max - 1) {
			buf[n++] = c;
			write(1, &c, 1);
		}
	}
}

// split cuts line into words at spaces; it returns how many.
static int split(char *s, char **argv)
{
	int argc = 0;

	for (;;) {
		while (*s == ' ')
			*s++ = '\0';
		if (*s == '\0' || argc == MAXARGS)
			return argc;
		argv[argc++] = s;
		while (*s && *s != ' ')
			s++;
	}
}

static void help(void)
{
	print("commands:\n"
	      "  help          this list\n"
	      "  ls            the files on the disk, with their sizes\n"
	      "  cat NAME      print a file\n"
	      "  echo WORDS    print the words\n"
	      "  ticks         timer ticks since boot (10 a second)\n"
	      "  halt          power off\n");
}

static void dols(void)
{
	struct lsent e;

	for (int i = 0; ls(i, &e) == 0; i++) {
		print(e.name);
		for (int pad = strlen(e.name); pad < 16; pad++)
			print(" ");
		print(" ");
		printlong(e.size);
		print("\n");
	}
}

static void docat(char *name)
{
	char buf[64];
	long off = 0, n;

	while ((n = cat(name, off, buf, sizeof buf)) > 0) {
		write(1, buf, n);
		off += n;
	}
	if (n < 0) {
		print("cat: no such file: ");
		print(name);
		print("\n");
	}
}

static void echo(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (i > 1)
			print(" ");
		print(argv[i]);
	}
	print("\n");
}

void sh(void)
{
	char *argv[MAXARGS];

	for (;;) {
		print("$ ");
		getline(line, MAXLINE);
		int argc = split(line, argv);
		if (argc == 0)
			continue;
		if (strcmp(argv[0], "help") == 0)
			help();
		else if (strcmp(argv[0], "ls") == 0)
			dols();
		else if (strcmp(argv[0], "cat") == 0 && argc == 2)
			docat(argv[1]);
		else if (strcmp(argv[0], "cat") == 0)
			print("usage: cat NAME\n");
		else if (strcmp(argv[0], "echo") == 0)
			echo(argc, argv);
		else if (strcmp(argv[0], "ticks") == 0) {
			printlong(getticks());
			print("\n");
		} else if (strcmp(argv[0], "halt") == 0)
			halt();
		else {
			print("sh: unknown command: ");
			print(argv[0]);
			print("\n");
		}
	}
}
