// virtio_disk.c: a driver for the virtio block device in the first
// virtio-mmio slot, using the modern (version 2) register interface and
// one split virtqueue. It only reads, one 512-byte sector at a time, and
// waits for each read by polling the used ring.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/fs.h"

// virtio-mmio registers (32 bits each), by offset.
#define MAGIC 0x000 // "virt"
#define VERSION 0x004
#define DEVICE_ID 0x008
#define DEVICE_FEATURES 0x010
#define DEVICE_FEATURES_SEL 0x014
#define DRIVER_FEATURES 0x020
#define DRIVER_FEATURES_SEL 0x024
#define QUEUE_SEL 0x030
#define QUEUE_NUM_MAX 0x034
#define QUEUE_NUM 0x038
#define QUEUE_READY 0x044
#define QUEUE_NOTIFY 0x050
#define INTERRUPT_STATUS 0x060
#define INTERRUPT_ACK 0x064
#define STATUS 0x070
#define QUEUE_DESC_LOW 0x080
#define QUEUE_DESC_HIGH 0x084
#define QUEUE_DRIVER_LOW 0x090
#define QUEUE_DRIVER_HIGH 0x094
#define QUEUE_DEVICE_LOW 0x0a0
#define QUEUE_DEVICE_HIGH 0x0a4

#define Reg(off) (*(volatile uint32 *)(VIRTIO0 + (off)))

// Device status bits.
#define STATUS_ACKNOWLEDGE 1
#define STATUS_DRIVER 2
#define STATUS_DRIVER_OK 4
#define STATUS_FEATURES_OK 8

#define VIRTIO_F_VERSION_1_HI 1 // feature bit 32: word 1, bit 0

// The split virtqueue: descriptors, the driver's ring (avail) and the
// device's ring (used).
#define NUM 8
#define DESC_F_NEXT 1
#define DESC_F_WRITE 2 // the device writes this buffer
#define AVAIL_F_NO_INTERRUPT 1

struct desc {
	uint64 addr;
	uint32 len;
	uint16 flags;
	uint16 next;
};

struct avail {
	uint16 flags;
	uint16 idx;
	uint16 ring[NUM];
};

struct used {
	uint16 flags;
	uint16 idx;
	struct {
		uint32 id;
		uint32 len;
	} ring[NUM];
};

// A block request: this header, the data, a status byte.
#define BLK_T_IN 0 // read
struct blkreq {
	uint32 type;
	uint32 reserved;
	uint64 sector;
};

static struct {
	struct desc desc[NUM] __attribute__((aligned(16)));
	struct avail avail __attribute__((aligned(2)));
	struct used used __attribute__((aligned(4)));
	struct blkreq req;
	volatile uint8 status;
	uint16 seen; // used.idx as of the last completed read
} disk __attribute__((aligned(4096)));

void virtio_disk_init(void)
{
	if (Reg(MAGIC) != 0x74726976 || Reg(DEVICE_ID) != 2)
		panic("could not find virtio disk");
	if (Reg(VERSION) != 2)
		panic("virtio disk: legacy transport (add -global virtio-mmio.force-legacy=false)");

	Reg(STATUS) = 0; // reset
	Reg(STATUS) = STATUS_ACKNOWLEDGE;
	Reg(STATUS) = STATUS_ACKNOWLEDGE | STATUS_DRIVER;

	// Of the features the device offers, take none but VERSION_1,
	// which a driver of a modern device must accept.
	Reg(DEVICE_FEATURES_SEL) = 1;
	if (!(Reg(DEVICE_FEATURES) & VIRTIO_F_VERSION_1_HI))
		panic("virtio disk: no VERSION_1 feature");
	Reg(DRIVER_FEATURES_SEL) = 0;
	Reg(DRIVER_FEATURES) = 0;
	Reg(DRIVER_FEATURES_SEL) = 1;
	Reg(DRIVER_FEATURES) = VIRTIO_F_VERSION_1_HI;
	Reg(STATUS) = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
	if (!(Reg(STATUS) & STATUS_FEATURES_OK))
		panic("virtio disk: features not accepted");

	Reg(QUEUE_SEL) = 0;
	if (Reg(QUEUE_READY))
		panic("virtio disk: queue 0 in use");
	if (Reg(QUEUE_NUM_MAX) < NUM)
		panic("virtio disk: queue 0 too short");
	Reg(QUEUE_NUM) = NUM;
	Reg(QUEUE_DESC_LOW) = (uint64)disk.desc;
	Reg(QUEUE_DESC_HIGH) = (uint64)disk.desc >> 32;
	Reg(QUEUE_DRIVER_LOW) = (uint64)&disk.avail;
	Reg(QUEUE_DRIVER_HIGH) = (uint64)&disk.avail >> 32;
	Reg(QUEUE_DEVICE_LOW) = (uint64)&disk.used;
	Reg(QUEUE_DEVICE_HIGH) = (uint64)&disk.used >> 32;
	Reg(QUEUE_READY) = 1;
	disk.avail.flags = AVAIL_F_NO_INTERRUPT; // we poll

	Reg(STATUS) = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK;
}

// virtio_disk_read reads sector into buf (BSIZE bytes of kernel memory:
// the device is given its address, which is also its physical address).
void virtio_disk_read(uint64 sector, void *buf)
{
	disk.req.type = BLK_T_IN;
	disk.req.reserved = 0;
	disk.req.sector = sector;
	disk.status = 0xff;

	// One chain of three descriptors: header, data, status.
	disk.desc[0] = (struct desc){(uint64)&disk.req, sizeof disk.req, DESC_F_NEXT, 1};
	disk.desc[1] = (struct desc){(uint64)buf, BSIZE, DESC_F_WRITE | DESC_F_NEXT, 2};
	disk.desc[2] = (struct desc){(uint64)&disk.status, 1, DESC_F_WRITE, 0};

	disk.avail.ring[disk.avail.idx % NUM] = 0;
	__sync_synchronize(); // the device sees the chain before the index
	disk.avail.idx++;
	__sync_synchronize();
	Reg(QUEUE_NOTIFY) = 0;

	while (*(volatile uint16 *)&disk.used.idx == disk.seen)
		;
	__sync_synchronize();
	disk.seen++;
	Reg(INTERRUPT_ACK) = Reg(INTERRUPT_STATUS) & 3;
	if (disk.status != 0)
		panic("virtio disk: read failed");
}
