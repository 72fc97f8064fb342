// fs.c: the file system: a flat directory in sector 0 (see fs.h),
// read once at boot; files are read sector by sector when asked for.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/fs.h"
#include "kernel/syscall.h"

static struct dirent dir[NDIRENT];
static int nfiles;

void fsinit(void)
{
	static uint8 sector[BSIZE];

	virtio_disk_read(0, sector);
	memmove(dir, sector, sizeof dir);
	while (nfiles < NDIRENT && dir[nfiles].name[0] != '\0') {
		dir[nfiles].name[DIRNAME - 1] = '\0';
		nfiles++;
	}
	printf("fs: %d files\n", nfiles);
}

// fsstat fills in e for the i-th file; -1 if there is none.
int fsstat(int i, struct lsent *e)
{
	if (i < 0 || i >= nfiles)
		return -1;
	memmove(e->name, dir[i].name, DIRNAME);
	e->size = dir[i].size;
	return 0;
}

static struct dirent *lookup(const char *name)
{
	for (int i = 0; i < nfiles; i++) {
		const char *a = dir[i].name, *b = name;
		while (*a && *a == *b)
			a++, b++;
		if (*a == *b)
			return &dir[i];
	}
	return 0;
}

// fsread copies up to n bytes of file name, from byte off, to the user
// program's udst. It returns how many (0 past the end), or -1 if there is
// no such file or udst is not the user's.
long fsread(const char *name, uint64 off, uint64 udst, uint64 n)
{
	static uint8 sector[BSIZE];
	struct dirent *d = lookup(name);
	uint64 done = 0;

	if (d == 0)
		return -1;
	if (off >= d->size)
		return 0;
	if (n > d->size - off)
		n = d->size - off;
	while (done < n) {
		uint64 in = off % BSIZE, m = BSIZE - in;
		if (m > n - done)
			m = n - done;
		virtio_disk_read(d->start + off / BSIZE, sector);
		if (copyout(udst + done, sector + in, m) < 0)
			return -1;
		done += m;
		off += m;
	}
	return done;
}
