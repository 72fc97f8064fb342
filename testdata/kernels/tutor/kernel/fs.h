// fs.h: the disk format, shared by the kernel (kernel/fs.c) and the host
// tool that writes it (mkfs/mkfs.c).
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).
//
// Sector 0 is the directory: NDIRENT entries of 32 bytes. An entry whose
// name starts with a NUL byte is unused (mkfs fills them from the front).
// Each file's bytes start at a sector boundary and fill consecutive
// sectors. Numbers are little-endian.

#define BSIZE 512
#define DIRNAME 24 // a name is at most DIRNAME-1 bytes and NUL-terminated
#define NDIRENT (BSIZE / 32)

struct dirent {
	char name[DIRNAME];
	unsigned int start; // first sector
	unsigned int size;  // in bytes
};
