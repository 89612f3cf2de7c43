package driver_test

import (
	"fmt"
	"log"

	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

func ExampleAsBytes() {
	fmt.Printf("% x\n", driver.AsBytes([]uint32{1, 0xdeadbeef}))
	// Output: 01 00 00 00 ef be ad de
}

// Example shows the whole path: check availability, open a device, compile
// a kernel (through the cubin cache), run it and read the result back.
func Example() {
	if err := driver.Available(); err != nil {
		fmt.Println("falling back to the CPU:", err)
		return
	}
	ctx, err := driver.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()

	const src = `extern "C" __global__ void scale(float* x, unsigned int n, float k) {
	unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] = __fmul_rn(x[i], k);
}`
	mod, err := ctx.CompileModule(src, "scale.cu", driver.CompileOptions{NoFMAD: true})
	if err != nil {
		log.Fatal(err)
	}
	scale, err := mod.Function("scale")
	if err != nil {
		log.Fatal(err)
	}
	host := []float32{1, 2, 3, 4}
	dev, err := ctx.Alloc(4 * len(host))
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Free(dev)
	if err := ctx.HtoD(dev, driver.AsBytes(host)); err != nil {
		log.Fatal(err)
	}
	err = ctx.Launch(scale, driver.Dim3{1, 1, 1}, driver.Dim3{32, 1, 1}, 0, nil,
		dev, uint32(len(host)), float32(0.5))
	if err != nil {
		log.Fatal(err)
	}
	if err := ctx.DtoH(driver.AsBytes(host), dev); err != nil {
		log.Fatal(err)
	}
	fmt.Println(host) // [0.5 1 1.5 2]
}

// ExampleContext_Do batches several calls into one hand-over to the owner
// thread, and captures them into a CUDA graph for cheap replay.
func ExampleContext_Do() {
	if driver.Available() != nil {
		return
	}
	ctx, err := driver.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	stream, err := ctx.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer stream.Destroy()
	buf, err := ctx.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Free(buf)

	var exec *driver.GraphExec
	err = ctx.Do(func() error {
		if err := ctx.BeginCapture(stream); err != nil {
			return err
		}
		if err := ctx.Memset8Async(buf, 0, 1<<20, stream); err != nil {
			return err
		}
		graph, err := ctx.EndCapture(stream)
		if err != nil {
			return err
		}
		defer graph.Destroy()
		exec, err = ctx.Instantiate(graph)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	defer exec.Destroy()
	for range 3 {
		if err := ctx.GraphLaunch(exec, stream); err != nil {
			log.Fatal(err)
		}
	}
	if err := stream.Synchronize(); err != nil {
		log.Fatal(err)
	}
}

// ExampleContext_LaunchWith launches a kernel in thread-block clusters of
// 4 blocks (whose blocks may read each other's shared memory), with
// programmatic dependent launch.
func ExampleContext_LaunchWith() {
	if driver.Available() != nil {
		return
	}
	ctx, err := driver.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	if !ctx.Props().ClusterLaunches {
		fmt.Println("no thread-block clusters on", ctx.Props().Name)
		return
	}
	const src = `extern "C" __global__ void cluster_rank(unsigned int* out) {
	unsigned int rank;
	asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
	if (threadIdx.x == 0) out[blockIdx.x] = rank;
}`
	mod, err := ctx.CompileModule(src, "cluster_rank.cu", driver.CompileOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fn, err := mod.Function("cluster_rank")
	if err != nil {
		log.Fatal(err)
	}
	ranks := make([]uint32, 8)
	out, err := ctx.Alloc(4 * len(ranks))
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Free(out)
	opts := driver.LaunchOptions{PDL: true, Cluster: driver.Dim3{4, 1, 1}}
	err = ctx.LaunchWith(fn, driver.Dim3{uint32(len(ranks)), 1, 1}, driver.Dim3{32, 1, 1}, 0, nil, opts, out)
	if err != nil {
		log.Fatal(err) // e.g. ErrClusterShape: the grid is not a multiple of the cluster
	}
	if err := ctx.DtoH(driver.AsBytes(ranks), out); err != nil {
		log.Fatal(err)
	}
	fmt.Println(ranks) // [0 1 2 3 0 1 2 3]
}

// ExampleContext_MaxActiveClusters asks how many clusters of 8 blocks, each
// with 200 KB of dynamic shared memory, run at once: a grid of at most that
// many clusters runs in one wave.
func ExampleContext_MaxActiveClusters() {
	if driver.Available() != nil {
		return
	}
	ctx, err := driver.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	if !ctx.Props().ClusterLaunches {
		fmt.Println("no thread-block clusters on", ctx.Props().Name)
		return
	}
	const src = `extern "C" __global__ void stage(float* out) {
	extern __shared__ float tile[];
	tile[threadIdx.x] = threadIdx.x;
	__syncthreads();
	if (threadIdx.x == 0) out[blockIdx.x] = tile[blockDim.x - 1];
}`
	mod, err := ctx.CompileModule(src, "stage.cu", driver.CompileOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fn, err := mod.Function("stage")
	if err != nil {
		log.Fatal(err)
	}
	const shared = 200 << 10
	// Above 48 KiB a block, the function must be allowed its shared memory
	// before the query (and the launch).
	if err := fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, shared); err != nil {
		log.Fatal(err)
	}
	n, err := ctx.MaxActiveClusters(fn, driver.Dim3{384, 1, 1}, shared, driver.Dim3{8, 1, 1})
	if err != nil {
		log.Fatal(err) // e.g. ErrNoClusterOccupancy on a driver before CUDA 12
	}
	fmt.Printf("%d clusters of 8 blocks at once: grids of up to %d blocks run in one wave\n", n, 8*n)
}
