// The GPU's ex2.approx.f32 and lg2.approx.f32 (what exp2f and __logf compile to) on every fp32 input of a
// few ranges, against 2^x and log2 x rounded to fp32 toward zero (RZ)
// and to nearest (RN): how often each agrees, the histogram of hw - RZ in ulps, and, where the hardware
// gives RZ or the next value outward, how often it goes outward as a function of where the exact value
// lies between the two (16 bins). Self-contained so it runs on a bare GPU machine:
//   nvcc -O2 -arch=sm_90 scripts/gpu_sfu_probe.cu -o sfu && ./sfu
// Its output on the H200 (2026-11-27) is tests/data/sfu_probe/h200.txt; kernels/nv_math_model.hpp's model
// of the unit gives the same counts (docs/readings.md, "The special function unit").
#include <cstdio>
#include <cstdint>
typedef unsigned long long U;
__device__ U C[2][48];
template<int O>__global__ void k(unsigned lo,U n){
for(U i=blockIdx.x*(U)blockDim.x+threadIdx.x;i<n;i+=(U)gridDim.x*blockDim.x){
float x=__uint_as_float(lo+(unsigned)i),h;double e;
if(O==0){asm("ex2.approx.f32 %0,%1;":"=f"(h):"f"(x));e=exp2((double)x);}
else{asm("lg2.approx.f32 %0,%1;":"=f"(h):"f"(x));e=log2((double)x);}
float z=__double2float_rz(e);int d=(int)__float_as_uint(h)-(int)__float_as_uint(z);
atomicAdd(&C[O][(d>=-4&&d<=4)?d+4:9],1ULL);
if(h==__double2float_rn(e))atomicAdd(&C[O][10],1ULL);
float u=__uint_as_float(__float_as_uint(z)+1);double s=(double)u-(double)z;
if(z!=0&&s!=0&&(d==0||d==1)){int b=(int)((e-(double)z)/s*16);b=b<0?0:b>15?15:b;atomicAdd(&C[O][16+b+(d?16:0)],1ULL);}}}
template<int O>void r(const char*m,unsigned lo,unsigned hi){U z[48]={0};cudaMemcpyToSymbol(C,z,sizeof z,O*sizeof z);
k<O><<<2112,256>>>(lo,(U)hi-lo);U c[48];cudaMemcpyFromSymbol(c,C,sizeof c,O*sizeof c);U n=hi-lo;
printf("%s n=%llu RN-equal %.6f\n hw-RZ ulp -4..4:",m,n,c[10]/(double)n);for(int i=0;i<9;i++)printf(" %llu",c[i]);printf(" other %llu\n frac: P(up)[n]",c[9]);
for(int b=0;b<16;b++){U up=c[32+b],dn=c[16+b];printf(" %d:%.3f[%llu]",b,up/(double)(up+dn+1e-300),up+dn);}printf("\n");}
int main(){r<0>("ex2 (-126,0]",0x80000000u,0xC2FC0000u);r<0>("ex2 [-1,0]",0x80000000u,0xBF800001u);r<0>("ex2 [0,128)",0,0x43000000u);
r<1>("lg2 normals",0x00800000u,0x7F800000u);r<1>("lg2 [1,65536)",0x3F800000u,0x47800000u);r<1>("lg2 [0.5,2)",0x3F000000u,0x40000000u);
r<0>("ex2 [-20,-1/64]",0xBC800000u,0xC1A00001u);r<0>("ex2 [-1,-1/64]",0xBC800000u,0xBF800001u);r<0>("ex2 [-20,-8]",0xC1000000u,0xC1A00001u);
r<1>("lg2 [1,256)",0x3F800000u,0x43800000u);r<1>("lg2 [2,4)",0x40000000u,0x40800000u);}
