import time
from ddp_tutorial.launch import spawn
from ddp_tutorial.capstone.traffic import traffic_runs, layout_row
from ddp_tutorial.capstone.layout import layouts
from ddp_tutorial.capstone.reference import GPTRun
lays=[vars(l) for l in layouts(8, **GPTRun().model_limits()) if l.world_size==8 and l.cp==1]
t=time.time()
res=spawn(traffic_runs, 8, args=(lays,), timeout=500)
print(time.time()-t)
for i,l in enumerate(lays): print(layout_row(l,[r[i] for r in res]))
