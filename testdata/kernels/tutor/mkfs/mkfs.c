// mkfs: writes the tutor kernel's disk image (the format is in
// kernel/fs.h): mkfs IMAGE FILE... puts each FILE, by its base name,
// into a 1 MiB IMAGE. It runs on the build machine.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/fs.h"

#define IMAGESIZE (1024 * 1024)

static unsigned char image[IMAGESIZE];

static void die(const char *what, const char *name)
{
	fprintf(stderr, "mkfs: %s: %s\n", what, name);
	exit(1);
}

static void put32(unsigned char *p, unsigned int v)
{
	for (int i = 0; i < 4; i++)
		p[i] = v >> (8 * i);
}

int main(int argc, char **argv)
{
	unsigned int sector = 1; // sector 0 is the directory

	if (argc < 2) {
		fprintf(stderr, "usage: mkfs IMAGE FILE...\n");
		return 2;
	}
	if (argc - 2 > NDIRENT)
		die("too many files", argv[2 + NDIRENT]);
	for (int i = 2; i < argc; i++) {
		const char *base = strrchr(argv[i], '/');
		base = base ? base + 1 : argv[i];
		if (strlen(base) == 0 || strlen(base) >= DIRNAME)
			die("name empty or too long", base);

		FILE *f = fopen(argv[i], "rb");
		if (!f)
			die("cannot open", argv[i]);
		size_t room = IMAGESIZE - (size_t)sector * BSIZE;
		size_t n = fread(image + (size_t)sector * BSIZE, 1, room, f);
		if (ferror(f) || (n == room && fgetc(f) != EOF))
			die("cannot read, or does not fit", argv[i]);
		fclose(f);

		unsigned char *e = image + (i - 2) * sizeof(struct dirent);
		memcpy(e, base, strlen(base));
		put32(e + DIRNAME, sector);
		put32(e + DIRNAME + 4, n);
		sector += (n + BSIZE - 1) / BSIZE;
	}

	FILE *out = fopen(argv[1], "wb");
	if (!out || fwrite(image, 1, IMAGESIZE, out) != IMAGESIZE || fclose(out) != 0)
		die("cannot write", argv[1]);
	return 0;
}
