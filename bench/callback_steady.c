/*
 * Steady-state cost of one op's callbacks on one thread, no proxy thread:
 * CollApi start/stop, Coll start/stop, KernelCh start/record/stop, repeated N
 * times back to back (bit mask WHAT picks which of the three pairs run). The
 * best of 20 repetitions, with a pause between them for the writer to drain.
 * Complements callback_cost, which measures a cold-cache, lockstep pattern.
 *
 *   callback_steady PLUGIN.so N WHAT      e.g. callback_steady plugin.so 20000 7
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "profiler_v6.h"

static long long now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000LL+t.tv_nsec;}
int main(int argc,char**argv){
  if(argc<4){fprintf(stderr,"usage: callback_steady PLUGIN.so N WHAT\n");return 2;}
  void*h=dlopen(argv[1],RTLD_NOW|RTLD_LOCAL); if(!h){fprintf(stderr,"%s\n",dlerror());return 1;}
  ncclProfiler_v6_t*p=dlsym(h,"ncclProfiler_v5"); if(!p)return 1;
  int mask=0; void*ctx=NULL; int N=atoi(argv[2]); int what=atoi(argv[3]);
  p->init(&ctx,0x9c1491e7ef6b6d1fULL,&mask,NULL,1,2,0,NULL);
  ncclProfilerEventDescr_v6_t d; memset(&d,0,sizeof d);
  ncclProfilerEventDescr_v6_t dc; memset(&dc,0,sizeof dc); dc.type=ncclProfileColl; dc.coll.func="AllReduce"; dc.coll.count=1024; dc.coll.datatype="ncclFloat32"; dc.coll.nChannels=1; dc.coll.algo="RING"; dc.coll.proto="LL";
  ncclProfilerEventDescr_v6_t dk; memset(&dk,0,sizeof dk); dk.type=ncclProfileKernelCh;
  ncclProfilerEventStateArgs_v6_t a;
  long long best=1LL<<62;
  for(int rep=0;rep<20;rep++){
  long long t0=now();
  for(int i=0;i<N;i++){
    void*api=NULL,*coll=NULL,*k=NULL;
    d.type=ncclProfileCollApi; d.collApi.func="AllReduce"; d.collApi.count=1024; d.collApi.datatype="ncclFloat32";
    if(what&1){p->startEvent(ctx,&api,&d); if(api)p->stopEvent(api);}
    dc.parentObj=api; dc.coll.seqNumber=rep*N+i;
    if(what&2){p->startEvent(ctx,&coll,&dc); if(coll)p->stopEvent(coll);}
    if(what&4){dk.parentObj=coll; dk.kernelCh.pTimer=123456789; p->startEvent(ctx,&k,&dk);
    a.kernelCh.pTimer=123456999; if(k){p->recordEventState(k,ncclProfilerKernelChStop,&a); p->stopEvent(k);}}
  }
  long long t=now()-t0; if(t<best)best=t;
  struct timespec ts={0,30000000}; nanosleep(&ts,NULL); /* let the writer drain */
  }
  printf("%.1f ns/op\n",(double)best/N);
  p->finalize(ctx); return 0;
}
